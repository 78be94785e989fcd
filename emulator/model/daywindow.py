"""The night window of a day plan, `START-END` in hours: the calendar policy's (dayplan.py) and
the live plan's (daylive.py) one spelling and one test of it. Its own module: the live plan is
imported at every boot (the scheduler runs day plans), the policy's model (the serving and
training cost models under it) only when a day is simulated."""

from __future__ import annotations

from cmemu.emulator.model.errors import InvalidArgumentError, quote


def parse_window(text: str) -> tuple[float, float]:
    """A night window `START-END` in hours 0-24 ("22-7" crosses midnight); the calendar policy's
    and the live plan's one spelling."""
    start, sep, end = text.partition("-")
    try:
        window = (float(start), float(end))
    except ValueError:
        window = (-1.0, -1.0)
    if not sep or not all(0 <= h < 24 for h in window) or window[0] == window[1]:
        raise InvalidArgumentError(
            f"night window: START-END in hours 0-24, e.g. 22-7; got {quote(text)}", field="night"
        )
    return window


def in_window(at_s: float, window: tuple[float, float]) -> bool:
    """`at_s` into the day (any day: taken modulo 24 hours) falls inside the window."""
    start, end = window
    hour = (at_s / 3600.0) % 24
    return (hour >= start or hour < end) if start > end else start <= hour < end
