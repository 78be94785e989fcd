"""Durations as people type them, read one way everywhere: a scenario's `at: 1m30s` and the
CLI's `--for 1m30s` (emulator/model/chaos/units.py, emulator/cli/argtypes.py) both parse here."""

from __future__ import annotations

import math
import re

UNITS_S = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
# longer names first where one starts another (ms, min before m; sec before s)
_PART = r"([0-9]+(?:\.[0-9]+)?)\s*(us|ms|sec|s|min|m|h|d)"
_DURATION = re.compile(rf"^\s*(?:{_PART}\s*)+$")  # `30s`, `1m30s`, `1h 30m`
HELP = "a duration such as 30s, 10m, 1m30s, 1.5h, 500ms or 2d (a bare number is seconds)"


def seconds_in(text: str) -> float | None:
    """Seconds from one or more number-and-unit parts (`500ms`, `1m30s`); None when `text` is
    not such a duration (a bare number is the caller's to allow: a scenario's YAML gives it as a
    number, the CLI as text)."""
    if not _DURATION.match(text):
        return None
    value = sum(float(n) * UNITS_S[unit] for n, unit in re.findall(_PART, text))
    return value if math.isfinite(value) else None
