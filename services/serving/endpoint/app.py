"""The OpenAI endpoint's HTTP application (aiohttp): its routes, its handlers and the one
middleware that makes every answer OpenAI-shaped. Made when the endpoint starts serving
(services/serving/openai_http.py `OpenAiServer.start`), not with the router: the router is made at
every boot, and aiohttp's import (0.2 s of CPU) waits until the launcher is ready.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog
from aiohttp import web

from cmemu.emulator.engines.serving.driver import Driver
from cmemu.emulator.engines.serving.streams import Stream
from cmemu.emulator.model.errors import EmulatorError, quote
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.tokens import VOCAB
from cmemu.emulator.model.tenants import Priority, Tenant
from cmemu.services.serving.endpoint import outputs
from cmemu.services.serving.endpoint.admission import Ticket
from cmemu.services.serving.endpoint.asks import Ask, Parser
from cmemu.services.serving.endpoint.errors import HttpError, from_domain
from cmemu.services.serving.endpoint.limits import read_json
from cmemu.services.serving.endpoint.responses import CHAT, COMPLETIONS, Answer, Reply, Shape
from cmemu.services.serving.tokenizer import Loaded, Tokenizer, output_ids

if TYPE_CHECKING:
    from cmemu.services.serving.openai_http import OpenAiServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = structlog.get_logger("cmemu.router")
OPENAPI = Path(__file__).resolve().parent / "openapi.json"


@dataclass
class _Held:
    """The slots a request holds now (a preempted one holds new ones when it resumes)."""

    ticket: Ticket | None = None


def application(server: OpenAiServer) -> web.Application:
    """The endpoint's routes over `server` (its router, admission, limits and tokenizer)."""
    routes = Routes(server)
    app = web.Application(
        client_max_size=server.limits.http_body_max_bytes, middlewares=[routes.errors]
    )
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/v1/models/{model}", routes.model)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/v1/chat/completions", routes.chat)
    app.router.add_get("/health", routes.health)
    app.router.add_get("/openapi.json", routes.openapi)
    return app


class Routes:
    """The handlers: each reads the endpoint's state (`server`) as it is at the request."""

    def __init__(self, server: OpenAiServer) -> None:
        self.server = server
        self._openapi = json.loads(OPENAPI.read_text(encoding="utf-8"))
        self._rng = np.random.default_rng()

    # --- every answer OpenAI-shaped ------------------------------------------------------------

    @web.middleware
    async def errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
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
            "created": self.server.created,
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
        deployments = list(self.server.router.deployments.items())
        # no card: no need to load it
        loaded = await self.server.tokenizer() if deployments else None
        data = [self._card(name, live, loaded) for name, live in deployments if loaded]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        live = self.server.router.deployments.get(name)
        if live is None:
            raise self._unknown(name)
        return web.json_response(self._card(name, live, await self.server.tokenizer()))

    def _unknown(self, model: str) -> HttpError:
        deployed = sorted(self.server.router.deployments)
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
        tenant = self.server.admission.tenant(request.headers.get("Authorization", ""))
        body = await read_json(request, self.server.limits)
        tokenizer = (await self.server.tokenizer()).tokenizer
        # token ids as the model's embedding takes them (the model card's vocabulary)
        parser = Parser(tokenizer=tokenizer, limits=self.server.limits, vocab=VOCAB)
        ask = await (parser.chat(body) if shape is CHAT else parser.completion(body))
        driver = self._driver(ask.model)
        context = get_model(driver.engine.deployment.model).context_tokens
        lengths = ask.lengths(context, self.server.limits.max_tokens_max)
        prompt_tokens = sum(len(p) for p in ask.prompts)
        self.server.admission.admit(tenant, prompt_tokens)
        reply: Reply | None = None
        held = _Held()
        try:
            slots = len(ask.prompts) * ask.n
            held.ticket = await self.server.admission.acquire(tenant, driver, slots)
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
                self.server.admission.release(held.ticket)
            if reply is not None and reply.billed:
                self.server.admission.charge(tenant, prompt_tokens, reply.usage())
            else:  # refused or failed: nothing to bill, the admission given back
                self.server.admission.refund(tenant, prompt_tokens)

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
            held.ticket = await self.server.admission.acquire(tenant, driver, 1)
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
            clock=self.server.clock,
            lag_tolerance_s=self.server.limits.release_lag_tolerance_s,
            lags=self.server.release_lag,
        )

    def _driver(self, model: str) -> Driver:
        if not self.server.router.deployments:
            raise HttpError(503, "no model is deployed (cmemu serve-model)", "service_unavailable")
        if model not in self.server.router.deployments:
            raise self._unknown(model)
        try:
            return self.server.router.serving(model)
        except EmulatorError as exc:
            raise from_domain(exc) from exc
