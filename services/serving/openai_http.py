"""The OpenAI-compatible HTTP endpoint of the router (aiohttp).

`/v1/models`, `/v1/completions` and `/v1/chat/completions`, streamed as server-sent events in
OpenAI's chunk format (ending `data: [DONE]`) or answered whole, with `usage` (in the last chunk
too with `stream_options.include_usage`). The `model` is a deployment's name. Token text is
synthetic; each token is released when the engine emits it on the emulated clock, and every
chunk carries that emulated instant in an extra `cmemu` member (clients ignore unknown members).
A client that goes away cancels its request, which frees its KV cache.

Bad input gets OpenAI-style JSON errors: 400 for a malformed request, 404 for a model that is
not deployed, 503 while nothing (or not this model yet) serves.

A request that fails (issue 11: its die was lost and its retries ran out, or no instance is left
to run it) fails visibly, never silently. Not streamed: HTTP 503 with a `Retry-After` header and
an OpenAI error body (`code` "request_failed"). Streamed (the 200 and earlier tokens are already
out): a last chunk with `finish_reason` "error", then an event `{"error": {...}}` (the shape
OpenAI's own streams use, which its client raises as an APIError), then `data: [DONE]`. A request
the engine retried and finished is a normal completion: its tokens simply continue.
"""

from __future__ import annotations

import hmac
import json
import math
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from emulator.model.errors import (
    AddressInUseError,
    CapacityError,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
)
from emulator.model.serving.engine import FinishEvent, FinishReason, TokenEvent
from emulator.model.serving.tokens import VOCAB, output_text, text_tokens
from services.serving.driver import Driver, Stream

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_BODY_BYTES = 32 * 2**20
SHUTDOWN_S = 2.0  # wall seconds the endpoint gives its last responses when it stops
RETRY_AFTER_S = 1  # the hint a failed request's 503 carries when its error names none
STATUS: tuple[tuple[type[EmulatorError], int, str], ...] = (
    (InvalidArgumentError, 400, "invalid_request_error"),
    (NotFoundError, 404, "not_found_error"),
    (UnavailableError, 503, "service_unavailable"),
    (CapacityError, 429, "rate_limit_error"),
    (PreconditionError, 409, "conflict_error"),
)


class Deployments(Protocol):
    """What the endpoint needs of the router."""

    @property
    def deployments(self) -> Mapping[str, Any]: ...

    def serving(self, model: str) -> Driver: ...


class HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.retry_after_s = retry_after_s


def _error(
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    *,
    code: str | None = None,
    retry_after_s: float | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    headers = {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return web.json_response(body, status=status, headers=headers)


def _from_domain(exc: EmulatorError) -> HttpError:
    for cls, status, kind in STATUS:
        if isinstance(exc, cls):
            return HttpError(status, str(exc), kind, exc.field, exc.retry_after_s)
    return HttpError(500, str(exc), "server_error")


def failed_error(event: FinishEvent) -> dict[str, Any]:
    """The OpenAI error object of a request that failed (ERROR)."""
    return {
        "message": f"the request failed: {event.error}",
        "type": "service_unavailable",
        "param": None,
        "code": "request_failed",
    }


def _bad(message: str, param: str | None = None) -> HttpError:
    return HttpError(400, message, "invalid_request_error", param)


# --- request bodies ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Ask:
    model: str
    tokens: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool


def _int(body: Mapping[str, Any], key: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(f"{key} must be an integer", key)
    return value


def _common(body: Mapping[str, Any], tokens: list[int], max_key: str) -> Ask:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required (a deployment's name: GET /v1/models)", "model")
    max_tokens = _int(body, max_key, _int(body, "max_tokens", DEFAULT_MAX_TOKENS))
    if max_tokens < 1:
        raise _bad(f"{max_key} must be >= 1", max_key)
    if _int(body, "n", 1) != 1:
        raise _bad("only n=1 is supported", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    if options and not stream:
        raise _bad("stream_options is only allowed with stream=true", "stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise _bad("stream_options.include_usage must be a boolean", "stream_options")
    if not tokens:
        raise _bad("the prompt is empty", "prompt")
    return Ask(
        model=model,
        tokens=tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include,
    )


def _prompt_tokens(prompt: Any) -> list[int]:
    """A prompt as text, a list with one text, or token ids (one list of ints)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return text_tokens(prompt)
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        if any(not 0 <= t < VOCAB for t in prompt):
            raise _bad(f"token ids must be 0..{VOCAB - 1}", "prompt")
        return list(prompt)
    raise _bad("prompt must be a string or a list of token ids (one prompt per request)", "prompt")


def completion_ask(body: Mapping[str, Any]) -> Ask:
    if "prompt" not in body:
        raise _bad("prompt is required", "prompt")
    return _common(body, _prompt_tokens(body["prompt"]), "max_tokens")


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _bad(f"{where}: only text content parts are supported", "messages")
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}: a text part needs text", "messages")
            parts.append(text)
        return "".join(parts)
    if content is None:
        return ""
    raise _bad(f"{where}.content must be a string or a list of parts", "messages")


def chat_ask(body: Mapping[str, Any]) -> Ask:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}] needs a role", "messages")
        lines.append(f"<{message['role']}>{_content(message.get('content'), f'messages[{i}]')}\n")
    # the chat template renders the history in order: a longer chat shares its prefix
    return _common(body, text_tokens("".join(lines) + "<assistant>"), "max_completion_tokens")


# --- responses -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Shape:
    """What differs between the completions and the chat endpoints."""

    prefix: str
    whole: str  # object of a whole response
    chunk: str  # object of a streamed chunk
    piece: Callable[[str, bool], dict[str, Any]]  # (text, first) -> choice content
    final: Callable[[str], dict[str, Any]]  # whole text -> choice content


COMPLETIONS = Shape(
    prefix="cmpl",
    whole="text_completion",
    chunk="text_completion",
    piece=lambda text, first: {"text": text, "logprobs": None},
    final=lambda text: {"text": text, "logprobs": None},
)
CHAT = Shape(
    prefix="chatcmpl",
    whole="chat.completion",
    chunk="chat.completion.chunk",
    piece=lambda text, first: {
        "delta": {"role": "assistant", "content": text} if first else {"content": text},
        "logprobs": None,
    },
    final=lambda text: {
        "message": {"role": "assistant", "content": text, "refusal": None},
        "logprobs": None,
    },
)


FINISH_REASONS = {
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
    FinishReason.ERROR: "error",
}


def _finish(event: FinishEvent) -> str:
    return FINISH_REASONS[event.reason]


def _usage(stream: Stream, tokens: int) -> dict[str, int]:
    prompt = stream.request.input_tokens
    return {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}


def _timing(stream: Stream) -> dict[str, Any]:
    m = stream.metrics
    return {
        "request": stream.request.id,
        "arrival_ns": m.arrival_ns,
        "ttft_ns": m.ttft_ns,
        "tpot_ns": m.tpot_ns,
        "queueing_ns": m.queueing_ns,
        "prefix_hit_tokens": m.prefix_hit_tokens,
    }


class OpenAiServer:
    def __init__(self, router: Deployments) -> None:
        self.router = router
        self.token: str | None = None
        self.app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._guard])
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/health", self.health)
        self._runner: web.AppRunner | None = None
        self.created = int(time.time())

    async def start(self, address: str, token: str | None = None) -> None:
        """Serve at `address`; with a token, requests (not the model list) need it as their
        bearer API key, as the gRPC services need it for what changes state."""
        self.token = token
        host, _, port = address.rpartition(":")
        # a client that goes away cancels its handler: its request is then cancelled too
        runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_S
        )
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]") or None, int(port), reuse_port=False)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise AddressInUseError("router (HTTP)", address) from exc
        self._runner = runner

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.token and request.method == "POST":
            given = request.headers.get("Authorization", "")
            expected = f"Bearer {self.token}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return _error(
                    401,
                    "this endpoint needs the emulator's token as the API key "
                    "(Authorization: Bearer <token>)",
                    "invalid_request_error",
                )
        return await handler(request)

    # --- handlers ------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {"id": name, "object": "model", "created": self.created, "owned_by": "cmemu"}
            for name in self.router.deployments
        ]
        return web.json_response({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, completion_ask, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat_ask, CHAT)

    async def _serve(
        self,
        request: web.Request,
        parse: Callable[[Mapping[str, Any]], Ask],
        shape: Shape,
    ) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise _bad(f"the body is not JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise _bad("the body must be a JSON object")
            ask = parse(body)
            driver = self._driver(ask.model)
            stream = driver.submit(ask.tokens, ask.max_tokens)
        except HttpError as exc:
            return _error(exc.status, str(exc), exc.kind, exc.param)
        except EmulatorError as exc:
            err = _from_domain(exc)
            return _error(
                err.status, str(err), err.kind, err.param, retry_after_s=err.retry_after_s
            )
        try:
            if ask.stream:
                return await self._stream(request, stream, ask, shape)
            return await self._whole(stream, ask, shape)
        finally:
            if stream.finished is None:  # the client went away (or we are stopping)
                driver.cancel(stream.request.id)

    def _driver(self, model: str) -> Driver:
        if not self.router.deployments:
            raise HttpError(503, "no model is deployed (cmemu serve-model)", "service_unavailable")
        if model not in self.router.deployments:
            raise HttpError(
                404,
                f"the model {model!r} does not exist; deployed: "
                f"{', '.join(sorted(self.router.deployments))}",
                "invalid_request_error",
                "model",
            )
        return self.router.serving(model)

    def _head(self, stream: Stream, ask: Ask, shape: Shape, obj: str) -> dict[str, Any]:
        return {
            "id": f"{shape.prefix}-{stream.request.id}-{uuid.uuid4().hex[:8]}",
            "object": obj,
            "created": int(time.time()),
            "model": ask.model,
            "system_fingerprint": "cmemu",
        }

    async def _whole(self, stream: Stream, ask: Ask, shape: Shape) -> web.Response:
        parts: list[str] = []
        seed = zlib.crc32(stream.request.id.encode())
        finish, tokens = "length", 0
        async for event in stream:
            if isinstance(event, TokenEvent):
                parts.append(output_text(seed, event.index, event.count))
                continue
            if event.reason is FinishReason.ERROR:
                err = failed_error(event)
                return _error(
                    503, err["message"], err["type"], code=err["code"], retry_after_s=RETRY_AFTER_S
                )
            finish = _finish(event)
            tokens = event.tokens
        body = self._head(stream, ask, shape, shape.whole)
        body["choices"] = [{"index": 0, "finish_reason": finish, **shape.final("".join(parts))}]
        body["usage"] = _usage(stream, tokens)
        body["cmemu"] = _timing(stream)
        return web.json_response(body)

    async def _stream(
        self, request: web.Request, stream: Stream, ask: Ask, shape: Shape
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        head = self._head(stream, ask, shape, shape.chunk)
        seed = zlib.crc32(stream.request.id.encode())

        async def send(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        first = True
        async for event in stream:
            if isinstance(event, TokenEvent):
                text = output_text(seed, event.index, event.count)
                choice = {"index": 0, "finish_reason": None, **shape.piece(text, first)}
                first = False
                await send(
                    {
                        **head,
                        "choices": [choice],
                        "cmemu": {
                            "emulated_ns": round(event.time_s * 1e9),
                            "index": event.index,
                            "count": event.count,
                        },
                    }
                )
                continue
            last = {"index": 0, "finish_reason": _finish(event), **shape.piece("", False)}
            if shape is CHAT:
                last["delta"] = {}
            await send(
                {
                    **head,
                    "choices": [last],
                    "cmemu": {"emulated_ns": round(event.time_s * 1e9), **_timing(stream)},
                }
            )
            if ask.include_usage:
                await send({**head, "choices": [], "usage": _usage(stream, event.tokens)})
            if event.reason is FinishReason.ERROR:
                await send({"error": failed_error(event)})
        await send("[DONE]")
        await response.write_eof()
        return response
