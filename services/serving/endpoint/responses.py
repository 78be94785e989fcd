"""OpenAI's response shapes for the engine's events: a whole body, or server-sent events in
OpenAI's chunk format ending `data: [DONE]`, one choice per engine request.

Every chunk carries its emulated instant in an extra `cmemu` member (clients ignore unknown
members) and how late the endpoint released it: `lag_ms`, wall milliseconds between the instant
the wall clock reached the token's emulated time and the chunk's going out. When the emulator
cannot keep pace with the wall clock (a busy host, a time scale too fast), tokens leave late and
together; the last chunk of each choice says so (`first_token_lag_ms`, `max_lag_ms`, `kept_pace`)
so that a client's measured TTFT and ITL can be read against the emulated ones.

A request that fails (its die was lost and its retries ran out, or no instance is left to run
it) fails visibly. Not streamed: HTTP 503 with `Retry-After` and `code` "request_failed".
Streamed (the 200 and earlier tokens are out): a last chunk with `finish_reason` "error", then an
event `{"error": {...}}` (the shape OpenAI's own streams use, which its client raises as an
APIError), then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from cmemu.emulator.engines.serving.stats import RequestMetrics
from cmemu.emulator.engines.serving.streams import Stream
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.instruments import Histogram
from cmemu.emulator.model.serving.engine import FinishEvent, FinishReason, TokenEvent
from cmemu.services.serving.endpoint import outputs
from cmemu.services.serving.endpoint.asks import Ask
from cmemu.services.serving.endpoint.errors import HttpError, failed_error
from cmemu.services.serving.endpoint.outputs import Choice
from cmemu.services.serving.tokenizer import Tokenizer

RETRY_AFTER_S = 1  # the hint a failed request's 503 carries


@dataclass(frozen=True, kw_only=True)
class Shape:
    """What differs between the completions and the chat endpoints."""

    prefix: str
    whole: str  # object of a whole response
    chunk: str  # object of a streamed chunk
    piece: Callable[[str, bool], dict[str, Any]]  # (text, first) -> choice content
    final: Callable[[str], dict[str, Any]]  # whole text -> choice content
    last: Callable[[], dict[str, Any]]  # the closing chunk's choice content


COMPLETIONS = Shape(
    prefix="cmpl",
    whole="text_completion",
    chunk="text_completion",
    piece=lambda text, first: {"text": text, "logprobs": None},
    final=lambda text: {"text": text, "logprobs": None},
    last=lambda: {"text": "", "logprobs": None},
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
    last=lambda: {"delta": {}, "logprobs": None},
)


@dataclass(eq=False)
class Answer:
    """One choice in flight: its plan, its engine stream, what went out."""

    choice: Choice
    stream: Stream
    first: RequestMetrics | None = None  # the first engine request's (a continuation's differ)
    offset: int = 0  # tokens emitted before the present engine request (preemptions)
    preempted: bool = False  # its engine request was cancelled to make room: resume it
    preemptions: int = 0
    sent_chars: int = 0
    tokens: int = 0
    first_lag_s: float | None = None
    max_lag_s: float = 0.0
    finished: FinishEvent | None = None

    def finish_reason(self) -> str:
        event = self.finished
        if event is None or event.reason is FinishReason.CANCELLED:
            return "abort"
        if event.reason is FinishReason.ERROR:
            return "error"
        return self.choice.finish


@dataclass(eq=False, kw_only=True)
class Reply:
    """One response being answered: the request, its answers, how they go out."""

    ask: Ask
    shape: Shape
    answers: list[Answer]
    tokenizer: Tokenizer
    clock: Clock
    lag_tolerance_s: float
    lags: Histogram | None = None  # every token's release lag (wall seconds), for /metrics
    # a preempted answer's continuation: its new engine stream, or None when nothing is left
    resume: Callable[[Answer], Awaitable[Stream | None]] | None = None
    billed: bool = False  # the response carries (or carried) its usage: meter it
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])

    # --- what every response says ---------------------------------------------------------

    def head(self, obj: str) -> dict[str, Any]:
        return {
            "id": f"{self.shape.prefix}-{self.id}",
            "object": obj,
            "created": self.created,
            "model": self.ask.model,
            "system_fingerprint": "cmemu",
        }

    def usage(self) -> dict[str, Any]:
        """vLLM's counting: each prompt once, every choice's output; cached tokens are the
        prompt's prefix found in EMS (each prompt's first choice)."""
        prompt = sum(len(p) for p in self.ask.prompts)
        completion = sum(a.tokens for a in self.answers)
        firsts = [a for a in self.answers if a.choice.index % self.ask.n == 0]
        cached = sum(_metrics(a).prefix_hit_tokens for a in firsts)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt)},
        }

    def timing(self, answer: Answer) -> dict[str, Any]:
        m = _metrics(answer)
        first = answer.first_lag_s
        return {
            "request": m.request_id,
            "arrival_ns": m.arrival_ns,
            "ttft_ns": m.ttft_ns,
            "tpot_ns": m.tpot_ns if not answer.preemptions else None,
            "queueing_ns": m.queueing_ns,
            "prefix_hit_tokens": m.prefix_hit_tokens,
            "preemptions": answer.preemptions,
            "first_token_lag_ms": None if first is None else round(first * 1e3, 3),
            "max_lag_ms": round(answer.max_lag_s * 1e3, 3),
            "kept_pace": answer.max_lag_s <= self.lag_tolerance_s,
        }

    def _take(self, answer: Answer, event: TokenEvent) -> str:
        """The text of a token event, and its lag noted."""
        lag = max(0.0, self.clock.wall() - self.clock.wall_at(round(event.time_s * 1e9)))
        if self.lags is not None:
            self.lags.observe(lag)
        if answer.first_lag_s is None:
            answer.first_lag_s = lag
        answer.max_lag_s = max(answer.max_lag_s, lag)
        piece = outputs.text(
            self.tokenizer, answer.choice, event.index, event.count, answer.sent_chars
        )
        answer.sent_chars += len(piece)
        answer.tokens = event.index + event.count
        return piece

    def lag_ms(self, event: TokenEvent) -> float:
        lag = max(0.0, self.clock.wall() - self.clock.wall_at(round(event.time_s * 1e9)))
        return round(lag * 1e3, 3)

    # --- whole ---------------------------------------------------------------------------------

    async def whole(self) -> web.Response:
        texts: list[list[str]] = [[] for _ in self.answers]
        async for k, event in self.events():
            answer = self.answers[k]
            if isinstance(event, TokenEvent):
                texts[k].append(self._take(answer, event))
            elif event.reason is FinishReason.ERROR:
                err = failed_error(event)
                raise HttpError(
                    503,
                    err["message"],
                    err["type"],
                    code=err["code"],
                    retry_after_s=RETRY_AFTER_S,
                )
        body = self.head(self.shape.whole)
        body["choices"] = [
            {
                "index": a.choice.index,
                "finish_reason": a.finish_reason(),
                **self.shape.final("".join(texts[k])),
            }
            for k, a in enumerate(self.answers)
        ]
        body["usage"] = self.usage()
        self.billed = True
        body["cmemu"] = [self.timing(a) for a in self.answers]
        if len(self.answers) == 1:
            body["cmemu"] = body["cmemu"][0]
        return web.json_response(body)

    # --- streamed ------------------------------------------------------------------------------

    async def streamed(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        self.billed = True  # whatever goes out from here was served
        head = self.head(self.shape.chunk)

        async def send(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        failed: FinishEvent | None = None
        started: set[int] = set()
        async for k, event in self.events():
            answer = self.answers[k]
            index = answer.choice.index
            if isinstance(event, TokenEvent):
                piece = self._take(answer, event)
                choice = {"index": index, "finish_reason": None}
                choice |= self.shape.piece(piece, k not in started)
                started.add(k)
                timing: dict[str, Any] = {
                    "emulated_ns": round(event.time_s * 1e9),
                    "index": event.index,
                    "count": event.count,
                    "lag_ms": self.lag_ms(event),
                }
                await send({**head, "choices": [choice], "cmemu": timing})
                continue
            last = {"index": index, "finish_reason": answer.finish_reason(), **self.shape.last()}
            timing = {"emulated_ns": round(event.time_s * 1e9), **self.timing(answer)}
            await send({**head, "choices": [last], "cmemu": timing})
            if event.reason is FinishReason.ERROR and failed is None:
                failed = event
        if self.ask.include_usage:
            await send({**head, "choices": [], "usage": self.usage()})
        if failed is not None:
            await send({"error": failed_error(failed)})
        await send("[DONE]")
        await response.write_eof()
        return response

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent | FinishEvent]]:
        """Every answer's events as they come, tagged with the answer's position; ends when
        every answer has finished."""
        if len(self.answers) == 1:  # the common case: no tasks
            async for event in self._events_of(self.answers[0]):
                yield 0, event
            return
        merged: asyncio.Queue[tuple[int, TokenEvent | FinishEvent]] = asyncio.Queue()

        async def pump(k: int, answer: Answer) -> None:
            async for event in self._events_of(answer):
                merged.put_nowait((k, event))

        tasks = [
            asyncio.create_task(pump(k, a), name=f"answer-{a.stream.request.id}")
            for k, a in enumerate(self.answers)
        ]
        try:
            open_ = len(self.answers)
            while open_:
                k, event = await merged.get()
                if isinstance(event, FinishEvent):
                    open_ -= 1
                yield k, event
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _events_of(self, answer: Answer) -> AsyncIterator[TokenEvent | FinishEvent]:
        """One answer's events, across its engine requests: a preempted one's cancel is not its
        end but a pause, after which its continuation's events follow, renumbered."""
        while True:
            resumed = False
            async for event in answer.stream:
                if isinstance(event, TokenEvent):
                    yield replace(event, index=event.index + answer.offset)
                    continue
                if event.reason is FinishReason.CANCELLED and answer.preempted and self.resume:
                    answer.offset += event.tokens
                    answer.preempted = False
                    answer.preemptions += 1
                    stream = await self.resume(answer)
                    if stream is not None:
                        answer.stream = stream
                        resumed = True
                        break
                    event = replace(event, reason=FinishReason.LENGTH, tokens=0)  # noqa: PLW2901
                end = replace(event, tokens=event.tokens + answer.offset)
                answer.finished = end
                answer.tokens = end.tokens
                yield end
                return
            if not resumed:
                return


def _metrics(answer: Answer) -> RequestMetrics:
    return answer.first or answer.stream.metrics
