"""Workloads as data: length distributions, an arrival process, a prefix reuse rate and a seed
(parsed from a plain dict: the CLI reads YAML into one), or a real trace in the Mooncake format
(one JSON object per line: `timestamp` ms, `input_length`, `output_length`, `hash_ids` one per
512-token block, prefix-chained). Both become the engine's Requests.

A generated prompt reuses a prefix with the given rate: that share of its full blocks (rounded
at random) is one of `prefix_pool` shared prefixes, chosen uniformly; the rest of its blocks are
its own. Once every shared prefix is cached, the block hit rate approaches the reuse rate.

Multi-turn conversations (`turns` > 1), where a prefix cache matters most: each arrival starts a
conversation of `turns` requests `turn_gap_s` apart (the user reading and typing); turn k's
prompt is the whole conversation so far (every earlier prompt's new text and every answer) plus
its new user text (`input`), its answer `output` long. Its blocks are the conversation's, so turn
k finds turn k-1's prompt cached. Requests are named `c<conversation>.<turn>` (`turn_of`);
`requests` then counts conversations.

A shifting mix (`phases`, issue 24 item 4, where dynamic PD earns its keep): a list of phases,
each `duration_s` long with its own `input`, `output` and `rate_per_s` (any left out are the
workload's), run in order and again from the first until the workload's duration ends. Arrivals
and lengths come from the one seeded generator, so a seed gives the same requests every time.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.lengths import (
    DISTRIBUTIONS,
    Distribution,
    number,
    parse_distribution,
    sample,
)

__all__ = [
    "DISTRIBUTIONS",
    "Distribution",
    "Workload",
    "generate",
    "parse_workload",
    "sample",
    "turn_of",
]

SUPPORTED_VERSION = 1


def _poisson(rate: float, rng: np.random.Generator) -> float:
    return float(rng.exponential(1.0 / rate))


def _constant_gap(rate: float, rng: np.random.Generator) -> float:
    return 1.0 / rate


ARRIVALS: dict[str, Callable[[float, np.random.Generator], float]] = {
    "poisson": _poisson,
    "constant": _constant_gap,
}


@dataclass(frozen=True, kw_only=True)
class Phase:
    """A stretch of a shifting mix (module docstring)."""

    duration_s: float
    input: Distribution
    output: Distribution
    rate_per_s: float


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
    turns: int = 1  # requests per conversation (module docstring)
    turn_gap_s: float = 30.0  # between a conversation's turns
    phases: tuple[Phase, ...] = ()  # a shifting mix (module docstring); empty: one mix


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
            values[key] = parse_distribution(value, key)
        elif key == "arrival":
            if value not in ARRIVALS:
                raise UnknownNameError("arrival process", str(value), ARRIVALS, field=key)
            values[key] = value
        elif key in ("requests", "prefix_pool", "seed", "turns"):
            values[key] = number(value, key, int)
        elif key != "phases":
            values[key] = number(value, key)
    w = Workload(**values)
    if "phases" in body:
        w = dataclasses.replace(w, phases=_phases(body["phases"], w))
    _check(w)
    return w


_PHASE_FIELDS = ("duration_s", "input", "output", "rate_per_s")


def _phases(raw: Any, w: Workload) -> tuple[Phase, ...]:
    """`phases` as Phases, each field it leaves out the workload's own."""
    if not isinstance(raw, list) or not raw:
        raise InvalidArgumentError("phases must be a non-empty list", field="phases")
    out = []
    for k, item in enumerate(raw):
        where = f"phases[{k}]"
        if not isinstance(item, Mapping) or "duration_s" not in item:
            raise InvalidArgumentError(f"{where} must be a mapping with duration_s", field=where)
        unknown = sorted(set(item) - set(_PHASE_FIELDS))
        if unknown:
            raise InvalidArgumentError(
                f"{where}: unknown fields {unknown}; known: {list(_PHASE_FIELDS)}", field=where
            )
        phase = Phase(
            duration_s=number(item["duration_s"], f"{where}.duration_s"),
            input=parse_distribution(item["input"], f"{where}.input")
            if "input" in item
            else w.input,
            output=parse_distribution(item["output"], f"{where}.output")
            if "output" in item
            else w.output,
            rate_per_s=number(item.get("rate_per_s", w.rate_per_s), f"{where}.rate_per_s"),
        )
        if not (phase.duration_s > 0 and phase.rate_per_s > 0):
            raise InvalidArgumentError(
                f"{where}: need duration_s > 0 and rate_per_s > 0", field=where
            )
        out.append(phase)
    return tuple(out)


def phase_at(w: Workload, at_s: float) -> Phase:
    """The phase of a shifting mix in force at `at_s` (the phases repeat)."""
    cycle = sum(p.duration_s for p in w.phases)
    t = at_s % cycle
    for p in w.phases:
        if t < p.duration_s:
            return p
        t -= p.duration_s
    return w.phases[-1]


def _check(w: Workload) -> None:
    """A parsed workload's values in range (InvalidArgumentError naming the field)."""
    if not w.rate_per_s > 0:
        raise InvalidArgumentError("rate_per_s must be > 0", field="rate_per_s")
    if not 0 <= w.prefix_reuse <= 1:
        raise InvalidArgumentError("prefix_reuse must be in [0, 1]", field="prefix_reuse")
    if w.prefix_pool < 1 or w.requests < 0 or not w.duration_s > 0:
        raise InvalidArgumentError(
            "need prefix_pool >= 1, requests >= 0 and duration_s > 0", field="prefix_pool"
        )
    if w.phases and w.turns > 1:
        raise InvalidArgumentError("phases and turns > 1 do not mix", field="phases")
    if w.turns < 1:
        raise InvalidArgumentError(f"turns must be >= 1, got {w.turns}", field="turns")
    if not w.turn_gap_s > 0:
        raise InvalidArgumentError(
            f"turn_gap_s must be > 0, got {w.turn_gap_s}", field="turn_gap_s"
        )


def turn_of(request_id: str) -> int | None:
    """A multi-turn workload's request's turn (0 is the first); None for other requests."""
    head, dot, tail = request_id.partition(".")
    if not (head.startswith("c") and dot and tail.isdigit()):
        return None
    return int(tail)


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
    if w.turns > 1:
        yield from _conversations(w, rng, block_tokens=block_tokens, until=until)
        return
    gap = ARRIVALS[w.arrival]
    t = 0.0
    n = 0
    while (w.requests == 0 or n < w.requests) and (w.requests > 0 or t < until):
        mix = phase_at(w, t) if w.phases else w
        inp, out = sample(mix.input, rng), sample(mix.output, rng)
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
        t += gap(mix.rate_per_s, rng)


def _conversations(
    w: Workload, rng: np.random.Generator, *, block_tokens: int, until: float
) -> Iterator[Request]:
    """Multi-turn conversations (module docstring), their turns merged in arrival order."""
    gap = ARRIVALS[w.arrival]
    later: list[tuple[float, int, int, Request]] = []  # (arrival, conversation, turn, request)
    t = 0.0
    n = 0
    while (w.requests == 0 or n < w.requests) and (w.requests > 0 or t < until):
        while later and later[0][0] <= t:
            yield heapq.heappop(later)[3]
        context = 0
        for k in range(w.turns):
            prompt = context + sample(w.input, rng)
            out = sample(w.output, rng)
            keys = tuple(f"c{n}-{i}" for i in range(prompt // block_tokens))
            arrival = t + k * w.turn_gap_s
            request = Request(
                id=f"c{n}.{k}",
                arrival_s=arrival,
                input_tokens=prompt,
                output_tokens=out,
                block_keys=keys,
            )
            heapq.heappush(later, (arrival, n, k, request))
            context = prompt + out
        n += 1
        t += gap(w.rate_per_s, rng)
    while later:
        yield heapq.heappop(later)[3]


_TRACE_FIELDS = ("timestamp", "input_length", "output_length")


def read_mooncake(lines: Iterable[str], *, block_tokens: int) -> list[Request]:
    """Requests from a Mooncake trace (its lines). Only full blocks' ids become block keys (the
    trace also names the last, partial block). A bad line is an InvalidArgumentError naming it."""
    out: list[Request] = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{where}: not JSON ({exc.msg})", field=where) from None
        if not isinstance(row, dict):
            raise InvalidArgumentError(f"{where}: not a JSON object", field=where)
        missing = [k for k in _TRACE_FIELDS if k not in row]
        if missing:
            raise InvalidArgumentError(f"{where}: missing {missing}", field=where)
        ts = number(row["timestamp"], f"{where}.timestamp")
        inp = number(row["input_length"], f"{where}.input_length", int)
        outp = number(row["output_length"], f"{where}.output_length", int)
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
                id=f"t{line_no}",
                arrival_s=ts / 1000.0,
                input_tokens=inp,
                output_tokens=outp,
                block_keys=keys,
            )
        )
    out.sort(key=lambda r: r.arrival_s)
    return out
