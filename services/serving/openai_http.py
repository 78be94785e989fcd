"""The OpenAI-compatible HTTP endpoint of the router (aiohttp), in the dialect benchmark clients
speak (aiperf, guidellm, vLLM's own benchmark, the `openai` client).

Routes: `GET /v1/models` (each with `max_model_len`, vLLM's field for the context length) and
`GET /v1/models/{id}`, `POST /v1/completions` and `POST /v1/chat/completions` (whole or streamed
as server-sent events, services/serving/endpoint/responses.py), `GET /health`, and
`GET /openapi.json`, the endpoint's OpenAPI description (endpoint/openapi.json, which
schemathesis checks the endpoint against). The `model` is a deployment's name. Every answer
other than 200 is OpenAI's error JSON, unknown routes (404) and wrong methods (405) included.

A request passes, in order: its tenant (the API key: 401), its body (the limits of the hardware
profile: 413 too big, 400 malformed or nested too deep), its fields and prompt tokens (400),
the model (404, 503 while loading), the context (400 `context_length_exceeded`), its tenant's
rate limits and quota (429), its priority class's turn, and then the engine. A client that goes
away cancels its requests, which frees their KV cache. With TLS configured for the gRPC servers
the endpoint serves HTTPS with the same certificate.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from cmemu.emulator.engines.serving.usage import UsageMeter
from cmemu.emulator.model.address import parse_address
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import bind_error
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import SERVING_BUCKETS_S, Family, Histogram
from cmemu.emulator.model.tenants import Keys
from cmemu.services import listening
from cmemu.services.serving.endpoint.admission import OPEN_TENANT, Admission
from cmemu.services.serving.tokenizer import Loaded, load_tokenizer

if TYPE_CHECKING:  # imported when the endpoint serves (start): not at the router's making
    from aiohttp import web

    from cmemu.emulator.engines.serving.driver import Driver

SHUTDOWN_S = 2.0  # wall seconds the endpoint gives its last responses when it stops


class Deployments(Protocol):
    """What the endpoint needs of the router: its serving engine (emulator/engines/serving/)."""

    @property
    def deployments(self) -> Mapping[str, Any]: ...

    def serving(self, model: str) -> Driver: ...

    @property
    def usage(self) -> UsageMeter:
        """Where the tenants' use is metered (GetUsage and the day plans read it)."""
        ...


class OpenAiServer:
    def __init__(self, *, router: Deployments, profile: HardwareProfile, clock: Clock) -> None:
        self.router = router
        self.profile = profile
        self.clock = clock
        self.limits = profile.limits
        # the tokenizer (about 8 MB, 0.3 s of CPU) loads off the loop when first needed or when
        # a deployment is made (warm()): `cmemu up` alone never pays for it at boot
        self._loading: asyncio.Future[Loaded] | None = None
        self.admission = self._admission(None)
        self._sockets: list[socket.socket] = []  # bound by `bind`, served by `start`
        self._runner: web.AppRunner | None = None
        self.release_lag = Histogram(SERVING_BUCKETS_S)  # wall seconds a token left late
        self.created = int(time.time())

    def _admission(self, keys: Keys | None) -> Admission:
        s = self.profile.serving
        tenants = keys.tenants if keys is not None else (OPEN_TENANT,)
        return Admission(
            meter=self.router.usage.open(tenants),
            keys=keys,
            clock=self.clock,
            near_line_share=s.tenant_near_line_share,
            offline_share=s.tenant_offline_share,
        )

    async def bind(self, address: str, *, keys: Keys | None = None) -> None:
        """`address` bound and listening, not served yet (start), its tenants those of `keys`:
        the router binds it before it reports SERVING, and serves it once its launcher is ready
        (aiohttp's import, 0.2 s of CPU, is not the boot's); a client that connects meanwhile
        waits in the backlog. With keys, completions need a tenant's key (the model list stays
        open, as the gRPC services' reads do)."""
        if self._sockets:
            return
        self.admission = self._admission(keys)
        at = parse_address(address, any_port=True)
        try:
            self._sockets = await listening.listen(at.host, at.port)
        except OSError as exc:
            raise bind_error("router (HTTP)", address, exc) from exc

    async def start(
        self,
        address: str,
        *,
        keys: Keys | None = None,
        ssl_context: ssl.SSLContext | None = None,
        loaded: Loaded | None = None,
    ) -> None:
        """Serve at `address`, bound first with `keys` unless `bind` was; with an SSL context,
        HTTPS."""
        if loaded is not None:
            self._loading = asyncio.get_running_loop().create_future()
            self._loading.set_result(loaded)
        await self.bind(address, keys=keys)
        from aiohttp import web

        from cmemu.services.serving.endpoint.app import application

        # a client that goes away cancels its handler: its requests are then cancelled too
        runner = web.AppRunner(
            application(self),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=SHUTDOWN_S,
            keepalive_timeout=self.limits.http_idle_s,  # also a connection that never speaks
            max_line_size=self.limits.http_line_max_bytes,
            max_field_size=self.limits.http_header_max_bytes,
            max_headers=self.limits.http_headers_max,
        )
        await runner.setup()
        self._runner = runner
        for sock in self._sockets:
            await web.SockSite(runner, sock, ssl_context=ssl_context).start()

    def warm(self) -> None:
        """Start loading the tokenizer, if nothing has: a deployment will need it."""
        if self._loading is None:
            self._loading = asyncio.ensure_future(asyncio.to_thread(load_tokenizer))

    async def tokenizer(self) -> Loaded:
        """The tokenizer, loaded (off the loop) on the first call that needs it."""
        self.warm()
        assert self._loading is not None
        return await asyncio.shield(self._loading)

    async def stop(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        listening.close(self._sockets)  # bound and never served, or what cleanup left

    def metrics(self) -> list[Family]:
        lag = Family(
            name="cmemu_http_token_release_lag_seconds",
            help="Wall seconds each token left the endpoint after the wall clock reached its "
            "emulated instant (0 while the emulator keeps pace)",
            type="histogram",
            samples=[({}, self.release_lag.snapshot())],
        )
        return [*self.admission.metrics(), lag]
