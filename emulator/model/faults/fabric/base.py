"""What every fabric fault kind shares: the fault record the link graph reads (FaultSpec), the
Effect contract, and the kind record each kind's module declares (Kind). The kinds themselves
are one module each beside this one, registered in __init__.py KINDS; FaultSet
(emulator/model/linkfaults.py) runs them: an id, a duration, re-applying every active fault to a
clean graph whenever one is added or cleared.

Pure graph code, so the model layer: a kind's effect writes the link graph's arrays (`up`,
`factor`, `extra_latency_s`, `partitions`) and nothing else; the fabric engine owns the timers.
The graph is named only for typing, so a device process that only builds a FaultSpec (a slow
device's ports, a rank fault) imports no numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cmemu.emulator.model.faults.params import NoParams

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph

LINK = "a link 'a~b' (cmemu links)"  # most kinds' TARGET


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """One fabric fault as the link graph reads it, in the graph's units (seconds, tuples of
    ids): the same record on the wire's both ends and in process. A kind's typed parameters map
    onto its fields through the kind's own `to_spec` / `of_spec`."""

    kind: str
    target: str = ""
    factor: float = 0.0
    added_latency_s: float = 0.0
    side_a: tuple[str, ...] = ()
    side_b: tuple[str, ...] = ()
    id: str = ""
    period_s: float = 0.0  # link-flap: one down+up cycle, emulated
    duty: float = 0.0  # link-flap: share of the period down
    since_s: float = 0.0  # emulated instant it was added (a flap's phase counts from it)
    for_s: float = 0.0  # emulated seconds until the fabric clears it; 0: until cleared
    down: bool = False  # link-flap: in the down part of its cycle now (FaultSet.flap)
    loss_rate: float = 0.0  # link-loss: share of frames lost or failing CRC
    module: int = 0  # optical-module: which uplink module of the L1 chip (target)
    one_way: bool = False  # partition: side_a's frames to side_b lost, side_b's to side_a not

    @property
    def until_s(self) -> float:
        return self.since_s + self.for_s if self.for_s else 0.0


class Effect(Protocol):
    """What one kind does to the link graph: `validate` refuses a spec it cannot apply (an
    unknown link, switch or device: NotFoundError / InvalidArgumentError naming it) before it is
    stored; `apply` writes it onto the graph (a clean one plus the faults applied before)."""

    def validate(self, graph: LinkGraph, spec: FaultSpec) -> None: ...

    def apply(self, graph: LinkGraph, spec: FaultSpec) -> None: ...


def _none(_: Any) -> dict[str, Any]:
    return {}


def factor_to_spec(params: Any) -> dict[str, Any]:
    """A share kind's (`factor` in its params and in the spec alike)."""
    return {"factor": params.factor}


def factor_of_spec(spec: FaultSpec) -> dict[str, object]:
    return {"factor": spec.factor}


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One fabric fault kind, as its module declares it: its name, typed parameters (a frozen
    dataclass checked by emulator/model/faults/params.py; on the wire the message of the same
    name in FabricFault's `oneof params`), help, what its TARGET names, its effect on the link
    graph, and its wire mapping: `to_spec` turns its params into FaultSpec fields, `of_spec`
    reads them back by the params' names (both {} for a kind without params). The client's
    record of the kind is made from this one (emulator/client/faultkinds/fabric.py)."""

    name: str
    help: str
    effect: Effect
    params: type[Any] = NoParams
    target: str = LINK
    to_spec: Callable[[Any], dict[str, Any]] = _none
    of_spec: Callable[[FaultSpec], dict[str, object]] = _none
    # set at the fabric by a device's own fault and cleared with it (ports-degraded, rank-*):
    # no kind of the user's catalogue (`cmemu fault kinds`)
    from_device: bool = False
