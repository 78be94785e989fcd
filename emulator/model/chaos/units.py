"""Durations, sizes and rates as a scenario author types them (`30s`, `10m`, `1MiB`, `1%`).

Every parse error names the YAML path of the value (`steps[2].at`), so a bad scenario is fixed
without guessing which of its many durations was meant.
"""

from __future__ import annotations

import re

from cmemu.emulator.model.durations import HELP as DURATION_HELP
from cmemu.emulator.model.durations import seconds_in
from cmemu.emulator.model.errors import InvalidArgumentError, quote

SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
}
_SIZE = re.compile(r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*(?P<unit>[KMG]i?B|B)?\s*$")
_PERCENT = re.compile(r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*%\s*$")


def bad(path: str, message: str) -> InvalidArgumentError:
    """An invalid-argument error about the value at YAML path `path`."""
    return InvalidArgumentError(f"{path}: {message}", field=path)


def duration_s(value: object, path: str, *, allow_zero: bool = True) -> float:
    """Seconds from `30s`, `10m`, `1.5h`, `500ms`, `2d` or a bare number of seconds."""
    if isinstance(value, bool):
        raise bad(path, f"expected {DURATION_HELP}, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (parsed := seconds_in(value)) is not None:
        seconds = parsed
    else:
        raise bad(path, f"expected {DURATION_HELP}, got {quote(value)}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise bad(path, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return seconds


def size_bytes(value: object, path: str) -> int:
    """Bytes from `4096`, `64KiB`, `1MB`, `1e6`."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and (m := _SIZE.match(value)):
        size = int(float(m["n"]) * SIZE_UNITS[m["unit"] or ""])
        if size > 0:
            return size
    raise bad(path, f"expected a size > 0 such as 4096, 64KiB or 1MB, got {quote(value)}")


def count_or_rate(value: object, path: str) -> tuple[int | None, float | None]:
    """A tolerance: a count (`0`, `3`) or a rate (`1%`, `{rate: 0.01}`); exactly one is set."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value, None
    if isinstance(value, str) and (m := _PERCENT.match(value)):
        rate = float(m["n"]) / 100
    elif isinstance(value, dict) and set(value) == {"rate"}:
        rate = value["rate"]
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise bad(f"{path}.rate", f"expected a number in [0, 1], got {quote(rate)}")
        rate = float(rate)
    else:
        raise bad(
            path,
            f"expected a count >= 0, a percentage such as 1%, or {{rate: 0.01}}, "
            f"got {quote(value)}",
        )
    if not 0 <= rate <= 1:
        raise bad(path, f"a rate must be in [0, 1] (0% to 100%), got {value!r}")
    return None, rate


def format_s(seconds: float) -> str:
    """An emulated duration as a person reads it: 0.8s, 42.0s, 3m12s, 1h02m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
