"""The requests a serving driver accepted, as their callers see them: streams of events.

The engine speaks of requests by id; a caller holds a Stream. Each engine event lands here: in
the request's metrics, the deployment's counts, the event bus once it finishes, and its
stream's queue. Every accepted request ends in a finish, one the engine lost included (it is
counted dropped and fails visibly).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import structlog

from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.serving.stats import DeploymentStats, RequestMetrics
from cmemu.emulator.model.serving.engine import (
    Event,
    FinishEvent,
    FinishReason,
    Request,
    RetryEvent,
    TokenEvent,
)

log = structlog.get_logger("cmemu.router")


@dataclass(eq=False)
class Stream:
    """One request as its caller sees it: the engine's events for it, in order."""

    request: Request
    tokens: tuple[int, ...]
    metrics: RequestMetrics
    events: asyncio.Queue[TokenEvent | FinishEvent] = field(default_factory=asyncio.Queue)
    finished: FinishEvent | None = None
    accepted: bool = False  # the engine took it (its submit was applied)

    async def __aiter__(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        while True:
            event = await self.events.get()
            yield event
            if isinstance(event, FinishEvent):
                return


class Streams:
    """A deployment's open streams by request id, and the counts they make."""

    def __init__(self, *, name: str, events: EventSink | None) -> None:
        self.name = name
        self.events = events
        self.by_id: dict[str, Stream] = {}
        self.stats = DeploymentStats()
        self.open = 0  # accepted requests not finished: the engine's in_flight, or one is lost

    def fail(self, stream: Stream, at: float, error: str) -> None:
        self.deliver(
            FinishEvent(
                request_id=stream.request.id,
                time_s=at,
                reason=FinishReason.ERROR,
                tokens=stream.metrics.completion_tokens,
                error=error,
            )
        )

    def drop_lost(self, at: float, knows: Callable[[str], bool]) -> None:
        """Requests the driver accepted that the engine no longer knows, without a finish: a
        bug, never silent: each is counted dropped and fails with an error its client sees."""
        for stream in list(self.by_id.values()):
            if stream.accepted and not knows(stream.request.id):
                log.error("a request was lost", deployment=self.name, request=stream.request.id)
                self.stats.dropped += 1
                self.fail(stream, at, "the request was lost by the engine")

    def deliver(self, event: Event) -> None:
        stream = self.by_id.get(event.request_id)
        if stream is None:
            return
        m = stream.metrics
        t_ns = round(event.time_s * 1e9)
        if isinstance(event, RetryEvent):  # the client sees nothing: its tokens continue
            if m.retries == 0:
                self.stats.retried += 1
            m.retries += 1
            return
        if isinstance(event, TokenEvent):
            if m.first_token_ns is None:
                m.first_token_ns = t_ns
            m.last_token_ns = t_ns
            m.completion_tokens = event.index + event.count
        else:
            stream.finished = event
            m.cancelled = event.reason is FinishReason.CANCELLED
            m.failed = event.reason is FinishReason.ERROR
            m.error = event.error
            m.completion_tokens = event.tokens
            self.by_id.pop(event.request_id, None)
            self.stats.in_flight -= 1
            if stream.accepted:
                self.open -= 1
            self.stats.record(m)
            if self.events is not None:
                self.events.event("router", "request", t_ns, deployment=self.name, **m.detail())
        stream.events.put_nowait(event)

    def cancel_all(self, at_s: float) -> None:
        """Every stream still open finishes CANCELLED (the deployment is stopping)."""
        for stream in list(self.by_id.values()):
            self.deliver(
                FinishEvent(
                    request_id=stream.request.id,
                    time_s=at_s,
                    reason=FinishReason.CANCELLED,
                    tokens=stream.metrics.completion_tokens,
                )
            )
