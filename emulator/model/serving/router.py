"""Router policies, registered by name in ROUTERS: which prefill instance takes a new request,
which decode instance continues it. The engine calls them (the simulator's engine and the live
driver's are the same Engine, so this is the one place both route); they only choose.

- kv-aware: prefill by the cost a production KV-aware router gives an instance (`prefill_cost`,
  after Dynamo's KV router): the prompt blocks the instance would have to prefill, weighted by
  `serving.router_overlap_weight`, plus the blocks of prefill work it already has (queued and in
  flight). Blocks its HBM holds are credited whole; blocks only EMS holds (any instance can load
  them) as Dynamo credits a lower cache tier's hit, here at 1 - (loading a block from EMS) /
  (prefilling one), from the cost model (`cost.shared_block_credit`). So an instance holding
  the prompt's prefix wins only while it is not much busier than the others; and when the loads
  are imbalanced beyond SGLang's cache-aware thresholds (`router_balance_abs_blocks`,
  `router_balance_rel`) the least loaded instance takes it whatever it holds. It routes after the
  EMS lookup (`Router.after_lookup`), knowing what EMS holds. Decode by the most free KV slots.
- prefix-aware: prefill by a stable hash of the prompt's first block (requests sharing a prefix
  meet on one instance, whose batches then share it), unless that instance is a full batch
  behind the least loaded; decode as kv-aware.
- round-robin: in turn, whatever the load.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError


@dataclass(frozen=True, kw_only=True)
class Load:
    instance: str
    queued: float  # prefill: tokens waiting and in flight; decode: requests held or reserved
    free: int = 0  # decode: slots left
    cached: int = 0  # prefill: the prompt's leading blocks this instance holds in HBM


@dataclass(frozen=True, kw_only=True)
class RouteWeights:
    """The kv-aware cost's figures (serving profile: `router_*`) and the request it prices."""

    overlap: float  # weight of a prefill block against a block of load (Dynamo: 1.0)
    shared_credit: float  # a block only EMS holds saves this share of a block's prefill
    balance_abs_blocks: float  # SGLang's fallback: loads this many blocks apart ...
    balance_rel: float  # ... and the busiest this many times the idlest: least loaded wins
    block_tokens: int
    batch_tokens: int  # a full prefill batch (prefix-aware's slack)

    def __post_init__(self) -> None:
        ok = self.overlap >= 0 and self.balance_abs_blocks >= 0 and self.balance_rel >= 1
        if not (ok and 0 <= self.shared_credit <= 1):
            raise InvalidArgumentError(
                "router weights need overlap >= 0, shared_credit in [0, 1], "
                "balance_abs_blocks >= 0 and balance_rel >= 1",
                field="router",
            )


@dataclass
class RouterState:
    turn: int = 0


def prefill_cost(
    *,
    input_tokens: int,
    cached_blocks: int,
    load_tokens: float,
    w: RouteWeights,
    shared_blocks: int = 0,
) -> tuple[float, float]:
    """An instance's cost for a request, lowest best: (overlap weight x blocks it would prefill
    + blocks of work it has, blocks it would prefill). `cached_blocks` of the prompt are in its
    HBM, `shared_blocks` in EMS. With an infinite overlap weight the prefill blocks alone decide
    (ties by load): affinity whatever the queue."""
    shared = max(0, shared_blocks - cached_blocks) * w.shared_credit
    prefill = max(0.0, input_tokens / w.block_tokens - cached_blocks - shared)
    load = load_tokens / w.block_tokens
    if math.isinf(w.overlap):
        return prefill, load
    return w.overlap * prefill + load, prefill


def imbalanced(loads: Sequence[Load], w: RouteWeights) -> bool:
    """SGLang's cache-aware fallback test: the busiest instance is more than `balance_abs_blocks`
    ahead of the idlest and more than `balance_rel` times its load."""
    most = max(x.queued for x in loads) / w.block_tokens
    least = min(x.queued for x in loads) / w.block_tokens
    return most - least > w.balance_abs_blocks and most > least * w.balance_rel


@dataclass(frozen=True, kw_only=True)
class Ask:
    """The request a prefill instance is chosen for: its block keys, its prompt's tokens and
    how many of its leading blocks EMS holds (known after the lookup)."""

    keys: tuple[str, ...]
    tokens: int
    shared: int = 0


PrefillChooser = Callable[[Ask, Sequence[Load], RouteWeights, RouterState], str]
DecodeChooser = Callable[[Sequence[Load], RouterState], str | None]


def _least_queued(loads: Sequence[Load]) -> str:
    return min(loads, key=lambda x: (x.queued, x.instance)).instance


def _kv_cost(ask: Ask, loads: Sequence[Load], w: RouteWeights, st: RouterState) -> str:
    if not math.isinf(w.overlap) and imbalanced(loads, w):
        return _least_queued(loads)
    st.turn += 1
    n = len(loads)
    costs = [
        (
            prefill_cost(
                input_tokens=ask.tokens,
                cached_blocks=x.cached,
                load_tokens=x.queued,
                w=w,
                shared_blocks=ask.shared,
            ),
            (i - st.turn) % n,  # equal costs (idle instances) take turns
        )
        for i, x in enumerate(loads)
    ]
    return loads[costs.index(min(costs))].instance


def _by_prefix(ask: Ask, loads: Sequence[Load], w: RouteWeights, st: RouterState) -> str:
    keys = ask.keys
    if not keys:
        return _least_queued(loads)
    home = max(loads, key=lambda x: (zlib.crc32(f"{keys[0]}|{x.instance}".encode()), x.instance))
    least = min(x.queued for x in loads)
    return home.instance if home.queued <= least + w.batch_tokens else _least_queued(loads)


def _in_turn(ask: Ask, loads: Sequence[Load], w: RouteWeights, st: RouterState) -> str:
    st.turn += 1
    return loads[(st.turn - 1) % len(loads)].instance


def _most_free(loads: Sequence[Load], st: RouterState) -> str | None:
    best = max(loads, key=lambda x: (x.free, -x.queued, x.instance))
    return best.instance if best.free > 0 else None


def _decode_in_turn(loads: Sequence[Load], st: RouterState) -> str | None:
    free = [x for x in loads if x.free > 0]
    if not free:
        return None
    st.turn += 1
    return free[(st.turn - 1) % len(free)].instance


@dataclass(frozen=True)
class Router:
    prefill: PrefillChooser
    decode: DecodeChooser
    # weighs what the instances' HBM and EMS hold: chooses the prefill instance once EMS's hit
    # is known (after the lookup; at submit only without one)
    after_lookup: bool = False


ROUTERS: dict[str, Router] = {
    "kv-aware": Router(_kv_cost, _most_free, after_lookup=True),
    "prefix-aware": Router(_by_prefix, _most_free),
    "round-robin": Router(_in_turn, _decode_in_turn),
}
