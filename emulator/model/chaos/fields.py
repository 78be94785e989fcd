"""The typed readers of a scenario document's fields: each takes the raw YAML value and its path
(`steps[1].repeat.every`), and returns the value or raises InvalidArgumentError naming the path.
Shared by the scenario's sections (scenario.py, workloads.py) so every error reads alike."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from cmemu.emulator.model.chaos.units import bad
from cmemu.emulator.model.errors import quote

NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def mapping(raw: object, path: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise bad(path, f"expected a mapping, got {quote(raw)}")
    return {str(k): v for k, v in raw.items()}


def only(body: Mapping[str, Any], known: Sequence[str], path: str) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise bad(where, f"unknown field {quote(unknown[0])}; known: {', '.join(known)}")


def required(body: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in body:
        raise bad(path or "(top)", f"missing required field {quote(key)}")
    return body[key]


def integer(raw: object, path: str, *, minimum: int = 0) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise bad(path, f"expected an integer >= {minimum}, got {quote(raw)}")
    return raw


def number(raw: object, path: str, *, minimum: float = 0.0, maximum: float | None = None) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise bad(path, f"expected a number, got {quote(raw)}")
    if raw < minimum or (maximum is not None and raw > maximum):
        top = f" and <= {maximum:g}" if maximum is not None else ""
        raise bad(path, f"expected a number >= {minimum:g}{top}, got {raw!r}")
    return float(raw)


def string(raw: object, path: str) -> str:
    if not isinstance(raw, str):
        raise bad(path, f"expected a string, got {quote(raw)}")
    return raw


def label(raw: object, path: str) -> str:
    text = string(raw, path)
    if not NAME.match(text):
        raise bad(path, f"a name is a DNS label (a-z, 0-9, '-', at most 63), got {quote(text)}")
    return text


def listed(raw: object, path: str) -> list[Any]:
    if not isinstance(raw, list):
        raise bad(path, f"expected a list, got {quote(raw)}")
    return raw
