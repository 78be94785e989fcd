"""Progress bars (rich) for what makes a person wait: a boot, a long transfer.

Only on a terminal: when stderr is not a TTY (a pipe, a test parsing output) nothing is ever
printed. A bar appears only once the wait has lasted `delay_s`, and is transient: it leaves no
line behind. Everything runs on the event loop (loop.call_later); rich redraws from its own
thread, so the bar keeps moving while a long start holds the loop.

$CMEMU_PROGRESS_DELAY_S sets the delay (seconds, 0 or more; 2 by default): 0 draws a bar at
once, which a script recording a terminal (or a test) wants where the wait is short.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
from typing import TYPE_CHECKING, TextIO

from cmemu.emulator.model.errors import InvalidArgumentError

if TYPE_CHECKING:  # rich is imported when a bar shows (on a terminal), never before
    from rich.progress import Progress, TaskID

DELAY_S = 2.0
DELAY_ENV = "CMEMU_PROGRESS_DELAY_S"
TICK_S = 0.1


def configured_delay_s() -> float:
    """The wait before a bar shows: $CMEMU_PROGRESS_DELAY_S, else DELAY_S."""
    text = os.environ.get(DELAY_ENV)
    if text is None:
        return DELAY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgumentError(f"${DELAY_ENV}={text!r}: seconds, 0 or more", field=DELAY_ENV)
    return value


def wanted(stream: TextIO | None = None) -> bool:
    """Whether bars may be drawn on `stream` (stderr by default): only on a terminal. A bad
    $CMEMU_PROGRESS_DELAY_S is refused here, in a pipe too, not only where a bar would show."""
    configured_delay_s()
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


class DelayedBar:
    """One transient bar, shown from `delay_s` after creation until `close()`. Update it with
    `update()` at any time; before it shows, updates are only remembered. Create it on the
    event loop."""

    def __init__(
        self, description: str, total: float | None, *, delay_s: float | None = None
    ) -> None:
        self.description = description
        self.total = total
        self.completed = 0.0
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._closed = False
        wait = configured_delay_s() if delay_s is None else delay_s
        self._timer = asyncio.get_running_loop().call_later(wait, self._show)

    def update(
        self, completed: float, total: float | None = None, description: str | None = None
    ) -> None:
        self.completed = completed
        self.total = total if total is not None else self.total
        self.description = description or self.description
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task,
                completed=completed,
                total=self.total,
                description=self.description,
            )

    def _show(self) -> None:
        if self._closed:
            return
        # here, not at the top: a command whose stderr is no terminal never draws a bar and
        # never imports rich (emulator/cli/entry.py keeps it out of such processes)
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            self.description, total=self.total, completed=int(self.completed)
        )

    def close(self) -> None:
        self._closed = True
        self._timer.cancel()
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()


class BootBar:
    """`cmemu up` on a terminal: the launch API's progress callback (LaunchOptions.progress)
    drawn as a bar of servers SERVING out of all."""

    def __init__(self, *, delay_s: float | None = None) -> None:
        self.bar = DelayedBar("starting", None, delay_s=delay_s)

    def __call__(self, what: str, done: int, total: int) -> None:
        self.bar.update(done, total, what)

    def close(self) -> None:
        self.bar.close()


class TimedBar:
    """A wait whose length is known in advance (a paced transfer): the bar advances with the
    wall clock towards `expected_s`, stopping short of the end until `close()`."""

    def __init__(
        self, description: str, expected_s: float, *, delay_s: float | None = None
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.started = self.loop.time()
        self.expected_s = max(expected_s, 1e-3)
        self.bar = DelayedBar(description, 100.0, delay_s=delay_s)
        self._tick: asyncio.TimerHandle = self.loop.call_later(TICK_S, self._advance)

    def _advance(self) -> None:
        share = (self.loop.time() - self.started) / self.expected_s
        self.bar.update(min(99.0, 100.0 * share))
        self._tick = self.loop.call_later(TICK_S, self._advance)

    def close(self) -> None:
        self._tick.cancel()
        self.bar.close()
