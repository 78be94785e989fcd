"""Token-length distributions as data: a kind from DISTRIBUTIONS, its parameters, clipped to
[min, max]. Workloads draw prompt and output lengths from them, and a deployment's output-length
model (its requests' natural length, where the model would emit its end-of-sequence token) is one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError, quote


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """A token-length distribution: `kind` from DISTRIBUTIONS, its parameters, clipped to
    [min, max]."""

    kind: str = "constant"
    value: float = 0.0  # constant
    low: float = 0.0  # uniform
    high: float = 0.0
    mean: float = 0.0  # normal; lognormal: the median
    sigma: float = 0.0  # normal: std; lognormal: of the log
    min: int = 1
    max: int = 1_000_000


def _constant(d: Distribution, rng: np.random.Generator) -> float:
    return d.value


def _uniform(d: Distribution, rng: np.random.Generator) -> float:
    return float(rng.uniform(d.low, d.high + 1))


def _normal(d: Distribution, rng: np.random.Generator) -> float:
    return float(rng.normal(d.mean, d.sigma))


def _lognormal(d: Distribution, rng: np.random.Generator) -> float:
    return float(d.mean * math.exp(rng.normal(0.0, d.sigma)))


DISTRIBUTIONS: dict[str, Callable[[Distribution, np.random.Generator], float]] = {
    "constant": _constant,
    "uniform": _uniform,
    "normal": _normal,
    "lognormal": _lognormal,
}


def sample(d: Distribution, rng: np.random.Generator) -> int:
    return int(min(max(round(DISTRIBUTIONS[d.kind](d, rng)), d.min), d.max))


def number(value: Any, where: str, kind: type = float) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{where} must be a number, got {quote(value)}", field=where)
    if kind is int:
        if value != int(value):
            raise InvalidArgumentError(f"{where} must be a whole number", field=where)
        return int(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{where} must be finite", field=where)
    return float(value)


def parse_distribution(raw: Any, where: str) -> Distribution:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = {"kind": "constant", "value": raw}
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError(
            f"{where} must be a number or a mapping with a kind", field=where
        )
    fields = {f.name: f for f in dataclasses.fields(Distribution)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown fields {unknown}; known: {sorted(fields)}", field=where
        )
    kind = raw.get("kind", "constant")
    if kind not in DISTRIBUTIONS:
        raise UnknownNameError("distribution", str(kind), DISTRIBUTIONS, field=f"{where}.kind")
    values = {
        k: number(v, f"{where}.{k}", int if k in ("min", "max") else float)
        for k, v in raw.items()
        if k != "kind"
    }
    d = Distribution(kind=kind, **values)
    if d.min < 1 or d.max < d.min:
        raise InvalidArgumentError(f"{where}: need 1 <= min <= max", field=where)
    if kind == "uniform" and not d.low <= d.high:
        raise InvalidArgumentError(f"{where}: need low <= high", field=where)
    if kind in ("normal", "lognormal") and (d.sigma < 0 or (kind == "lognormal" and d.mean <= 0)):
        raise InvalidArgumentError(f"{where}: need sigma >= 0 (and mean > 0)", field=where)
    return d
