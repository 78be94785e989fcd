"""Router policies, registered by name in ROUTERS: which prefill instance takes a new request,
which decode instance continues it. The engine calls them; they only choose.

- kv-aware: prefill by the fewest queued tokens; decode by the most free KV slots.
- prefix-aware: prefill by a stable hash of the prompt's first block (requests sharing a prefix
  meet on one instance, whose batches then share it), unless that instance is a full batch
  behind the least loaded; decode as kv-aware.
- round-robin: in turn, whatever the load.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Load:
    instance: str
    queued: float  # prefill: tokens waiting; decode: requests held or reserved
    free: int = 0  # decode: slots left


@dataclass
class RouterState:
    turn: int = 0


PrefillChooser = Callable[[tuple[str, ...], Sequence[Load], float, RouterState], str]
DecodeChooser = Callable[[Sequence[Load], RouterState], str | None]


def _least_queued(
    keys: tuple[str, ...], loads: Sequence[Load], slack: float, st: RouterState
) -> str:
    return min(loads, key=lambda x: (x.queued, x.instance)).instance


def _by_prefix(keys: tuple[str, ...], loads: Sequence[Load], slack: float, st: RouterState) -> str:
    if not keys:
        return _least_queued(keys, loads, slack, st)
    home = max(loads, key=lambda x: (zlib.crc32(f"{keys[0]}|{x.instance}".encode()), x.instance))
    least = min(x.queued for x in loads)
    return home.instance if home.queued <= least + slack else _least_queued(keys, loads, slack, st)


def _in_turn(keys: tuple[str, ...], loads: Sequence[Load], slack: float, st: RouterState) -> str:
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


ROUTERS: dict[str, Router] = {
    "kv-aware": Router(_least_queued, _most_free),
    "prefix-aware": Router(_by_prefix, _most_free),
    "round-robin": Router(_in_turn, _decode_in_turn),
}
