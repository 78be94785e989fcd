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
import json
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import structlog
from aiohttp import web

from cmemu.emulator.engines.serving.driver import Driver
from cmemu.emulator.engines.serving.streams import Stream
from cmemu.emulator.engines.serving.usage import UsageMeter
from cmemu.emulator.model.address import parse_address
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.errors import EmulatorError, bind_error, quote
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import SERVING_BUCKETS_S, Family, Histogram
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.tokens import VOCAB
from cmemu.emulator.model.tenants import Keys, Priority, Tenant
from cmemu.services.serving.endpoint import outputs
from cmemu.services.serving.endpoint.admission import OPEN_TENANT, Admission, Ticket
from cmemu.services.serving.endpoint.asks import Ask, Parser
from cmemu.services.serving.endpoint.errors import HttpError, from_domain
from cmemu.services.serving.endpoint.limits import read_json
from cmemu.services.serving.endpoint.responses import CHAT, COMPLETIONS, Answer, Reply, Shape
from cmemu.services.serving.tokenizer import Loaded, Tokenizer, load_tokenizer, output_ids

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = structlog.get_logger("cmemu.router")
SHUTDOWN_S = 2.0  # wall seconds the endpoint gives its last responses when it stops
OPENAPI = Path(__file__).resolve().parent / "endpoint" / "openapi.json"


class Deployments(Protocol):
    """What the endpoint needs of the router: its serving engine (emulator/engines/serving/)."""

    @property
    def deployments(self) -> Mapping[str, Any]: ...

    def serving(self, model: str) -> Driver: ...

    @property
    def usage(self) -> UsageMeter:
        """Where the tenants' use is metered (GetUsage and the day plans read it)."""
        ...


@dataclass
class _Held:
    """The slots a request holds now (a preempted one holds new ones when it resumes)."""

    ticket: Ticket | None = None


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
        self.app = web.Application(
            client_max_size=self.limits.http_body_max_bytes, middlewares=[self._errors]
        )
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/v1/models/{model}", self.model)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/openapi.json", self.openapi)
        self._runner: web.AppRunner | None = None
        self._openapi = json.loads(OPENAPI.read_text(encoding="utf-8"))
        self._rng = np.random.default_rng()
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

    async def start(
        self,
        address: str,
        *,
        keys: Keys | None = None,
        ssl_context: ssl.SSLContext | None = None,
        loaded: Loaded | None = None,
    ) -> None:
        """Serve at `address`. With keys, completions need a tenant's key (the model list stays
        open, as the gRPC services' reads do); with an SSL context, HTTPS."""
        self.admission = self._admission(keys)
        if loaded is not None:
            self._loading = asyncio.get_running_loop().create_future()
            self._loading.set_result(loaded)
        at = parse_address(address, any_port=True)
        # a client that goes away cancels its handler: its requests are then cancelled too
        runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=SHUTDOWN_S,
            keepalive_timeout=self.limits.http_idle_s,  # also a connection that never speaks
            max_line_size=self.limits.http_line_max_bytes,
            max_field_size=self.limits.http_header_max_bytes,
            max_headers=self.limits.http_headers_max,
        )
        await runner.setup()
        site = web.TCPSite(runner, at.host, at.port, reuse_port=False, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise bind_error("router (HTTP)", address, exc) from exc
        self._runner = runner

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

    def metrics(self) -> list[Family]:
        lag = Family(
            name="cmemu_http_token_release_lag_seconds",
            help="Wall seconds each token left the endpoint after the wall clock reached its "
            "emulated instant (0 while the emulator keeps pace)",
            type="histogram",
            samples=[({}, self.release_lag.snapshot())],
        )
        return [*self.admission.metrics(), lag]

    # --- every answer OpenAI-shaped ------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except HttpError as exc:
            return exc.response()
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            response = HttpError(
                405, f"{request.method} is not allowed on {quote(request.path, 80)}; use {allowed}"
            ).response()
            response.headers["Allow"] = allowed
            return response
        except web.HTTPNotFound:
            return HttpError(
                404,
                f"no route {quote(request.path, 80)}: the endpoint serves /v1/models, "
                "/v1/completions and /v1/chat/completions",
                "not_found_error",
            ).response()
        except web.HTTPException as exc:
            return HttpError(exc.status, exc.reason or "refused").response()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: still OpenAI's shape, and logged with its traceback
            log.exception("the endpoint failed", path=request.path)
            return HttpError(500, "the emulator failed on this request", "server_error").response()

    # --- handlers ------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self._openapi)

    def _card(self, name: str, live: Any, loaded: Loaded) -> dict[str, Any]:
        spec = getattr(live, "spec", None)
        model = get_model(spec.model) if spec is not None else None
        tokenizer = loaded.tokenizer
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "cmemu",
            "root": spec.model if spec is not None else name,
            "parent": None,
            "max_model_len": model.context_tokens if model is not None else None,
            "permission": [],
            "cmemu": {
                "tokenizer": tokenizer.name,
                "exact_token_counts": tokenizer.exact,
            },
        }

    async def models(self, request: web.Request) -> web.Response:
        deployments = list(self.router.deployments.items())
        loaded = await self.tokenizer() if deployments else None  # no card: no need to load it
        data = [self._card(name, live, loaded) for name, live in deployments if loaded]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        live = self.router.deployments.get(name)
        if live is None:
            raise self._unknown(name)
        return web.json_response(self._card(name, live, await self.tokenizer()))

    def _unknown(self, model: str) -> HttpError:
        deployed = sorted(self.router.deployments)
        return HttpError(
            404,
            f"the model {quote(model, 64)} does not exist; deployed: "
            f"{', '.join(deployed) if deployed else 'none (cmemu serve-model)'}",
            "invalid_request_error",
            "model",
            code="model_not_found",
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    # --- serving -------------------------------------------------------------------------------

    async def _serve(self, request: web.Request, shape: Shape) -> web.StreamResponse:
        tenant = self.admission.tenant(request.headers.get("Authorization", ""))
        body = await read_json(request, self.limits)
        tokenizer = (await self.tokenizer()).tokenizer
        # token ids as the model's embedding takes them (the model card's vocabulary)
        parser = Parser(tokenizer=tokenizer, limits=self.limits, vocab=VOCAB)
        ask = await (parser.chat(body) if shape is CHAT else parser.completion(body))
        driver = self._driver(ask.model)
        context = get_model(driver.engine.deployment.model).context_tokens
        lengths = ask.lengths(context, self.limits.max_tokens_max)
        prompt_tokens = sum(len(p) for p in ask.prompts)
        self.admission.admit(tenant, prompt_tokens)
        reply: Reply | None = None
        held = _Held()
        try:
            held.ticket = await self.admission.acquire(tenant, driver, len(ask.prompts) * ask.n)
            reply = self._submit(driver, ask, shape, lengths, tokenizer)
            if len(reply.answers) == 1 and tenant.priority is not Priority.ONLINE:
                self._preemptible(reply, held, tenant, driver)
            try:
                if ask.stream:
                    return await reply.streamed(request)
                return await reply.whole()
            finally:
                for answer in reply.answers:
                    if answer.stream.finished is None:  # the client went away
                        driver.cancel(answer.stream.request.id)
        finally:
            if held.ticket is not None:
                self.admission.release(held.ticket)
            if reply is not None and reply.billed:
                self.admission.charge(tenant, prompt_tokens, reply.usage())
            else:  # refused or failed: nothing to bill, the admission given back
                self.admission.refund(tenant, prompt_tokens)

    def _preemptible(self, reply: Reply, held: _Held, tenant: Tenant, driver: Driver) -> None:
        """Let a higher class's arrival take this one-answer request's slot: its engine request
        is cancelled, and once its class may run again it continues where it stopped (its
        prompt and the tokens it had as the continuation's prompt, the rest as its output)."""
        answer = reply.answers[0]
        tokenizer = reply.tokenizer

        def preempt() -> None:
            answer.preempted = True
            driver.cancel(answer.stream.request.id)

        async def resume(a: Answer) -> Stream | None:
            left = a.choice.tokens - a.offset
            if left <= 0:
                return None
            held.ticket = await self.admission.acquire(tenant, driver, 1)
            held.ticket.preempt = preempt
            prompt = reply.ask.prompts[a.choice.prompt]
            done = output_ids(tokenizer, a.choice.seed, 0, a.offset)
            try:
                return driver.submit([*prompt, *done], left)
            except EmulatorError:
                return None  # the deployment is going away: the answer ends where it was

        answer.first = answer.stream.metrics
        assert held.ticket is not None
        held.ticket.preempt = preempt
        reply.resume = resume

    def _submit(
        self,
        driver: Driver,
        ask: Ask,
        shape: Shape,
        lengths: outputs.Lengths,
        tokenizer: Tokenizer,
    ) -> Reply:
        natural = driver.engine.deployment.output
        # any 64-bit seed, negative ones too (numpy takes none below 0)
        rng = np.random.default_rng(ask.seed % 2**64) if ask.seed is not None else self._rng
        answers: list[Answer] = []
        try:
            for p, tokens in enumerate(ask.prompts):
                for j in range(ask.n):
                    choice = outputs.plan(
                        index=p * ask.n + j,
                        prompt=p,
                        lengths=lengths,
                        natural=natural,
                        rng=rng,
                        tokenizer=tokenizer,
                    )
                    stream = driver.submit(tokens, choice.tokens)
                    answers.append(Answer(choice=choice, stream=stream))
        except EmulatorError as exc:
            for answer in answers:
                driver.cancel(answer.stream.request.id)
            raise from_domain(exc) from exc
        return Reply(
            ask=ask,
            shape=shape,
            answers=answers,
            tokenizer=tokenizer,
            clock=self.clock,
            lag_tolerance_s=self.limits.release_lag_tolerance_s,
            lags=self.release_lag,
        )

    def _driver(self, model: str) -> Driver:
        if not self.router.deployments:
            raise HttpError(503, "no model is deployed (cmemu serve-model)", "service_unavailable")
        if model not in self.router.deployments:
            raise self._unknown(model)
        try:
            return self.router.serving(model)
        except EmulatorError as exc:
            raise from_domain(exc) from exc
