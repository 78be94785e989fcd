"""A collective as its caller asks for it: no numpy here, so that a process that only asks (a
device's, a client's) needs none of the machinery that times it (emulator/model/collectives.py).
"""

from __future__ import annotations

from dataclasses import dataclass

COLLECTIVE_OPS = (
    "all-to-all",
    "all-gather",
    "reduce-scatter",
    "all-reduce",
    "broadcast",
    "moe-dispatch",
    "moe-combine",
)


@dataclass(frozen=True, kw_only=True)
class CollectiveSpec:
    """One collective as a request describes it: its op and its sizes, whole."""

    op: str
    bytes: int = 0
    bytes_per_pair: int = 0
    pair_bytes: tuple[int, ...] = ()
    root: int = 0
    tokens_per_rank: int = 0
    top_k: int = 0  # 0: the profile's (profile.moe.top_k)
    bytes_per_token: int = 0
