"""Workloads as data: length distributions, an arrival process, a prefix reuse rate and a seed
(parsed from a plain dict: the CLI reads YAML into one), or a real trace in the Mooncake format
(one JSON object per line: `timestamp` ms, `input_length`, `output_length`, `hash_ids` one per
512-token block, prefix-chained). Both become the engine's Requests.

A generated prompt reuses a prefix with the given rate: that share of its full blocks (rounded
at random) is one of `prefix_pool` shared prefixes, chosen uniformly; the rest of its blocks are
its own. Once every shared prefix is cached, the block hit rate approaches the reuse rate.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emulator.model.errors import InvalidArgumentError, UnknownNameError, quote
from emulator.model.serving.engine import Request

SUPPORTED_VERSION = 1


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


def _poisson(rate: float, rng: np.random.Generator) -> float:
    return float(rng.exponential(1.0 / rate))


def _constant_gap(rate: float, rng: np.random.Generator) -> float:
    return 1.0 / rate


ARRIVALS: dict[str, Callable[[float, np.random.Generator], float]] = {
    "poisson": _poisson,
    "constant": _constant_gap,
}


@dataclass(frozen=True, kw_only=True)
class Workload:
    input: Distribution = field(default_factory=lambda: Distribution(value=4096))
    output: Distribution = field(default_factory=lambda: Distribution(value=256))
    arrival: str = "poisson"
    rate_per_s: float = 10.0
    prefix_reuse: float = 0.0
    prefix_pool: int = 16
    requests: int = 0  # 0: as many as arrive within the duration
    duration_s: float = 60.0
    seed: int = 0


def sample(d: Distribution, rng: np.random.Generator) -> int:
    return int(min(max(round(DISTRIBUTIONS[d.kind](d, rng)), d.min), d.max))


def _number(value: Any, where: str, kind: type = float) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{where} must be a number, got {quote(value)}", field=where)
    if kind is int:
        if value != int(value):
            raise InvalidArgumentError(f"{where} must be a whole number", field=where)
        return int(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{where} must be finite", field=where)
    return float(value)


def _distribution(raw: Any, where: str) -> Distribution:
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
        k: _number(v, f"{where}.{k}", int if k in ("min", "max") else float)
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


def parse_workload(raw: Mapping[str, Any]) -> Workload:
    """Validate a workload document into a Workload."""
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError("a workload must be a mapping")
    body = dict(raw)
    version = body.pop("version", SUPPORTED_VERSION)
    if version != SUPPORTED_VERSION:
        raise InvalidArgumentError(
            f"workload version {version!r} unsupported; expected {SUPPORTED_VERSION}",
            field="version",
        )
    known = {f.name for f in dataclasses.fields(Workload)}
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidArgumentError(f"unknown workload fields {unknown}; known: {sorted(known)}")
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("input", "output"):
            values[key] = _distribution(value, key)
        elif key == "arrival":
            if value not in ARRIVALS:
                raise UnknownNameError("arrival process", str(value), ARRIVALS, field=key)
            values[key] = value
        elif key in ("requests", "prefix_pool", "seed"):
            values[key] = _number(value, key, int)
        else:
            values[key] = _number(value, key)
    w = Workload(**values)
    if not w.rate_per_s > 0:
        raise InvalidArgumentError("rate_per_s must be > 0", field="rate_per_s")
    if not 0 <= w.prefix_reuse <= 1:
        raise InvalidArgumentError("prefix_reuse must be in [0, 1]", field="prefix_reuse")
    if w.prefix_pool < 1 or w.requests < 0 or not w.duration_s > 0:
        raise InvalidArgumentError(
            "need prefix_pool >= 1, requests >= 0 and duration_s > 0", field="prefix_pool"
        )
    return w


def generate(
    w: Workload,
    *,
    block_tokens: int,
    duration_s: float | None = None,
    seed: int | None = None,
) -> Iterator[Request]:
    """The workload's requests in arrival order, deterministic for a seed."""
    rng = np.random.default_rng(w.seed if seed is None else seed)
    until = w.duration_s if duration_s is None else duration_s
    gap = ARRIVALS[w.arrival]
    t = 0.0
    n = 0
    while (w.requests == 0 or n < w.requests) and (w.requests > 0 or t < until):
        inp, out = sample(w.input, rng), sample(w.output, rng)
        blocks = inp // block_tokens
        keys: list[str] = []
        if blocks:
            shared = min(blocks, math.floor(w.prefix_reuse * blocks + rng.random()))
            prefix = int(rng.integers(w.prefix_pool))
            keys = [f"p{prefix}-{i}" for i in range(shared)]
            keys += [f"r{n}-{i}" for i in range(shared, blocks)]
        yield Request(
            id=f"r{n}", arrival_s=t, input_tokens=inp, output_tokens=out, block_keys=tuple(keys)
        )
        n += 1
        t += gap(w.rate_per_s, rng)


_TRACE_FIELDS = ("timestamp", "input_length", "output_length")


def read_mooncake(lines: Iterable[str], *, block_tokens: int) -> list[Request]:
    """Requests from a Mooncake trace (its lines). Only full blocks' ids become block keys (the
    trace also names the last, partial block). A bad line is an InvalidArgumentError naming it."""
    out: list[Request] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{where}: not JSON ({exc.msg})", field=where) from None
        if not isinstance(row, dict):
            raise InvalidArgumentError(f"{where}: not a JSON object", field=where)
        missing = [k for k in _TRACE_FIELDS if k not in row]
        if missing:
            raise InvalidArgumentError(f"{where}: missing {missing}", field=where)
        ts = _number(row["timestamp"], f"{where}.timestamp")
        inp = _number(row["input_length"], f"{where}.input_length", int)
        outp = _number(row["output_length"], f"{where}.output_length", int)
        ids = row.get("hash_ids", [])
        if not isinstance(ids, list) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in ids
        ):
            raise InvalidArgumentError(f"{where}: hash_ids must be integers", field=where)
        if ts < 0 or inp < 1 or outp < 1:
            raise InvalidArgumentError(
                f"{where}: need timestamp >= 0 and lengths >= 1", field=where
            )
        keys = tuple(str(i) for i in ids[: inp // block_tokens])
        out.append(
            Request(
                id=f"t{number}",
                arrival_s=ts / 1000.0,
                input_tokens=inp,
                output_tokens=outp,
                block_keys=keys,
            )
        )
    out.sort(key=lambda r: r.arrival_s)
    return out
