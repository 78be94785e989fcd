"""Argument types: every bad value becomes argparse.ArgumentTypeError, so argparse exits 2.

Also the shared `--name` / `--state-file` options of every command that reaches a running
emulator, and their resolution to one state file path.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path

from cmemu.emulator.model.durations import HELP as DURATION_HELP
from cmemu.emulator.model.durations import seconds_in
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError
from cmemu.emulator.model.presets import get_preset
from cmemu.emulator.runtime import state

U64_MAX = 2**64 - 1


class UsageError(InvalidArgumentError):
    """The command line is wrong in a way argparse cannot see by itself: exit 2 too."""


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*([a-zA-Z]*)\s*$")


def size(text: str) -> int:
    """A byte count: `4096`, `1e9`, `64KiB`, `1.5GB`; whole bytes in [0, 2**64-1]."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}: a whole number of bytes, e.g. 4096, 1e9, 64KiB, 2GB"
        )
    number = match.group(1)
    if re.fullmatch(r"\d+", number):
        value = int(number) * _UNITS[unit]
    else:
        as_float = float(number) * _UNITS[unit]
        if not math.isfinite(as_float) or as_float != int(as_float):
            raise argparse.ArgumentTypeError(f"bad size {text!r}: not a whole number of bytes")
        value = int(as_float)
    if value > U64_MAX:
        raise argparse.ArgumentTypeError(f"size {text!r} is over 2**64-1 bytes")
    return value


def positive_size(text: str) -> int:
    value = size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _whole(text, 1)


def non_negative_int(text: str) -> int:
    return _whole(text, 0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _duration(text: str) -> float:
    value: float | None
    try:
        value = float(text)  # a plain number is seconds (1e3 too)
    except ValueError:
        value = seconds_in(text.lower())
    if value is None or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} ({DURATION_HELP})")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a duration >= 0, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A positive duration in seconds, as a human types one: `30s`, `500ms`, `1h`, `800us`,
    `1m30s`, or a plain number of seconds (emulator/model/durations.py, as scenarios read
    them). Every CLI flag that takes a time uses it (or
    `non_negative_seconds`), so `--for 30s` and `--timeout 2` both mean what they say."""
    value = _duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a duration > 0, got {text!r}")
    return value


def non_negative_seconds(text: str) -> float:
    """A duration that may be zero (`--drain 0`: stop at once), as `seconds` reads it."""
    return _duration(text)


def preset(text: str) -> str:
    try:
        get_preset(text)
    except EmulatorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def instance_name(text: str) -> str:
    try:
        return state.check_name(text)
    except EmulatorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def choice_of(what: str, known: Callable[[], list[str]]) -> Callable[[str], str]:
    """A name from a registry table; the error lists the known ones."""

    def parse(text: str) -> str:
        names = known()
        if text not in names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; known: {', '.join(sorted(names))}"
            )
        return text

    parse.__name__ = what  # argparse names the type in its messages
    return parse


# --- which instance ------------------------------------------------------------------------------


def add_state_arg(p: argparse.ArgumentParser) -> None:
    """`--name NAME` or `--state-file PATH`: which running emulator a command talks to."""
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--name",
        type=instance_name,
        help=f"the instance's name, a DNS label (default {state.DEFAULT_NAME!r}); its state "
        f"file is {state.state_dir()}/NAME.json (directory: ${state.DIR_ENV_VAR}, else "
        "$XDG_STATE_HOME/cmemu)",
    )
    which.add_argument(
        "--state-file",
        metavar="PATH",
        help=f"the instance's state file itself (default ${state.ENV_VAR} or "
        f"{state.path_for(state.DEFAULT_NAME)})",
    )


def resolve_state(args: argparse.Namespace) -> Path | None:
    """The state file the options name (None for commands without them); stored back into
    `args.state_file` so that every command reads the same path."""
    if not hasattr(args, "state_file"):
        return None
    path = state.resolve(args.state_file, getattr(args, "name", None))
    args.state_file = str(path)
    return path
