"""A fault of the RDMA scale-out plane as the gateway holds it: its kind, its kind's typed
params (emulator/model/faults/gateway/<kind>.py), target, and how long.

Apart from the plane's graph (rdmagraph.py, numpy) so that a client or the CLI that only names
or shows a fault imports no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")  # a kind's params dataclass


@dataclass(frozen=True, kw_only=True)
class RdmaFault(Generic[P]):
    """What every plane fault has, and its kind's own params as the wire carries them (a slow
    kind's LinkDegradedParams, NoParams for the others): no field belongs to one kind."""

    kind: str
    params: P
    target: str
    for_s: float = 0.0  # emulated seconds until it clears itself; 0: until cleared
    since_s: float = 0.0
    id: str = ""

    @property
    def until_s(self) -> float:
        return self.since_s + self.for_s if self.for_s else 0.0
