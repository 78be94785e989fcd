"""A fault of the RDMA scale-out plane as the gateway holds it: its kind, target, and how long.

Apart from the plane's graph (rdmagraph.py, numpy) so that a client or the CLI that only names
or shows a fault imports no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RdmaFault:
    kind: str
    target: str
    factor: float = 0.0  # the slow kinds: remaining share of bandwidth, in (0, 1)
    for_s: float = 0.0  # emulated seconds until it clears itself; 0: until cleared
    since_s: float = 0.0
    id: str = ""

    @property
    def until_s(self) -> float:
        return self.since_s + self.for_s if self.for_s else 0.0
