"""Every call the soak makes goes through `Calls.call`, so that failures are counted by status in
one place, and the ones a reproduction needs (UNKNOWN, INTERNAL, hangs) are kept with the faults
then in force; `Figures` is everything the soak counts while it runs."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc

from cmemu.emulator.client.errors import describe

T = TypeVar("T")


class Page(Protocol):
    """A page of a paged List call."""

    @property
    def next_page_token(self) -> str: ...


P = TypeVar("P", bound=Page)

BAD = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)  # must never happen: target 0
KEPT = (*BAD, grpc.StatusCode.DEADLINE_EXCEEDED)  # kept as examples, with the faults in force
MAX_EXAMPLES = 100


@dataclass
class Figures:
    """What the soak counts while it runs."""

    started: float = 0.0
    answered: int = 0  # calls answered, with any status
    per_second: Counter[int] = field(default_factory=Counter)  # answered calls by second of run
    errors: Counter[str] = field(default_factory=Counter)  # by status code
    errors_by_call: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)  # UNKNOWN, INTERNAL, hangs
    wrong_reads: list[str] = field(default_factory=list)  # a read that disagreed with the ledger
    client_exceptions: list[str] = field(default_factory=list)  # the soak's own failures
    unexpected_messages: int = 0
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    big_objects: int = 0
    latency: dict[str, list[float]] = field(default_factory=dict)  # call: [count, sum, max] s

    def now(self) -> float:
        return time.monotonic() - self.started


class Calls:
    """The soak's calls and what they found: counted into `figures`; `faults_now` is what the
    chaos has in force, recorded with each kept example."""

    def __init__(self, figures: Figures) -> None:
        self.figures = figures
        self.faults_now: list[str] = []

    async def call(
        self,
        what: str,
        awaitable: Awaitable[T],
        answers: tuple[grpc.StatusCode, ...] = (),
        detail: str = "",
    ) -> T | grpc.StatusCode:
        """One call: its reply, or its status code when it failed. Every failure is counted by
        code unless it is in `answers` (a status that is the right answer, such as NOT_FOUND for a
        deleted key); UNKNOWN, INTERNAL and hangs are kept with the faults then in force."""
        started = time.monotonic()
        try:
            result = await awaitable
        except grpc.aio.AioRpcError as error:
            self._answered(what, started)
            code = error.code()
            if code in answers:
                return code
            self.figures.errors[code.name] += 1
            self.figures.errors_by_call[f"{what} {code.name}"] += 1
            if code in KEPT and len(self.figures.examples) < MAX_EXAMPLES:
                self.figures.examples.append(
                    {
                        "t": round(self.figures.now(), 2),
                        "call": what,
                        "request": detail,
                        "status": describe(error),
                        "faults": list(self.faults_now),
                    }
                )
            return code
        self._answered(what, started)
        return result

    def _answered(self, what: str, started: float) -> None:
        self.figures.answered += 1
        self.figures.per_second[int(self.figures.now())] += 1
        wall = time.monotonic() - started
        stats = self.figures.latency.setdefault(what, [0, 0.0, 0.0])
        stats[0] += 1
        stats[1] += wall
        stats[2] = max(stats[2], wall)

    async def retry(
        self, what: str, make: Callable[[], Awaitable[T]], detail: str
    ) -> T | grpc.StatusCode:
        """A verification read, tried again a few times while it fails: the reply, NOT_FOUND
        (an answer), or the last failure. `make` makes a fresh call for each try."""
        got: T | grpc.StatusCode = grpc.StatusCode.UNKNOWN
        for attempt in range(5):
            got = await self.call(what, make(), answers=(grpc.StatusCode.NOT_FOUND,), detail=detail)
            if not isinstance(got, grpc.StatusCode) or got is grpc.StatusCode.NOT_FOUND:
                return got
            await asyncio.sleep(0.5 * (attempt + 1))
        return got

    def wrong(self, text: str) -> None:
        """A read that disagreed with the ledger, stamped with the time of the run."""
        self.figures.wrong_reads.append(f"t={self.figures.now():.1f}s {text}")


async def pages(fetch: Callable[[str], Awaitable[P]]) -> AsyncIterator[P]:
    """Every page of a paged List call: `fetch` gets the page at a token ("" for the first)."""
    token = ""
    while True:
        page = await fetch(token)
        yield page
        token = page.next_page_token
        if not token:
            return
