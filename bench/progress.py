"""Progress bars for the benchmarks' loops (rich), on a terminal only.

The figures a benchmark prints go to stdout and are parsed; the bar goes to stderr, is
transient, and is never drawn when stderr is not a TTY (CI, pipes, tests). One helper for every
benchmark:

    for seed in progress.track(range(seeds), "replaying job streams"):
        ...
    with progress.steps("prefix-cache runs", total=6) as advance:
        ...; advance()
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")


def wanted() -> bool:
    """Bars only on a terminal: never in output a program reads."""
    return sys.stderr.isatty()


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )


@contextmanager
def steps(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A bar of `total` steps; the yielded call advances it (by 1 unless told)."""
    if not wanted():

        def nothing(n: int = 1) -> None:
            pass

        yield nothing
        return
    with _progress() as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)

        yield advance


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """`items`, one at a time, advancing a bar as each is done."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with steps(description, total) as advance:
        for item in items:
            yield item
            advance(1)
