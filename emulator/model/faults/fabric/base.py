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
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeGuard, TypeVar

from cmemu.emulator.model.faults.params import NoParams

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph

__all__ = ["LINK", "Effect", "FaultSpec", "Kind", "NoParams", "of_kind"]

LINK = "a link 'a~b' (cmemu links)"  # most kinds' TARGET

P = TypeVar("P")  # a kind's params dataclass


@dataclass(frozen=True, kw_only=True)
class FaultSpec(Generic[P]):
    """One fabric fault as the link graph reads it: what every fault has (kind, target, id,
    instants) and the kind's own typed params, in the params' units, as the user gave them and
    the wire carries them (FabricFault's `oneof params`). A kind's effect converts them to what
    the graph needs, in the kind's module, so no field here belongs to one kind but `down`."""

    kind: str
    params: P
    target: str = ""
    id: str = ""
    since_s: float = 0.0  # emulated instant it was added (a flap's phase counts from it)
    for_s: float = 0.0  # emulated seconds until the fabric clears it; 0: until cleared
    down: bool = False  # link-flap: in the down part of its cycle now (FaultSet.flap)

    @property
    def until_s(self) -> float:
        return self.since_s + self.for_s if self.for_s else 0.0


class Effect(Protocol[P]):
    """What one kind does to the link graph: `validate` refuses a spec it cannot apply (an
    unknown link, switch or device: NotFoundError / InvalidArgumentError naming it) before it is
    stored; `apply` writes it onto the graph (a clean one plus the faults applied before). Both
    take the kind's own params type, so mypy checks each effect against its kind's fields."""

    def validate(self, graph: LinkGraph, spec: FaultSpec[P]) -> None: ...

    def apply(self, graph: LinkGraph, spec: FaultSpec[P]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Kind(Generic[P]):
    """One fabric fault kind, as its module declares it: its name, typed parameters (a frozen
    dataclass checked by emulator/model/faults/params.py; on the wire the message of the same
    name in FabricFault's `oneof params`, mapped field by field by emulator/client/wire/
    faultparams.py for every kind alike), help, what its TARGET names and its effect on the
    link graph, typed by its params. The client's record of the kind is made from this one
    (emulator/client/faultkinds/fabric.py)."""

    name: str
    help: str
    effect: Effect[P]
    params: type[P]
    target: str = LINK
    # set at the fabric by a device's own fault and cleared with it (ports-degraded, rank-*):
    # no kind of the user's catalogue (`cmemu fault kinds`)
    from_device: bool = False
    # its params as `cmemu fault ls` shows them (`factor=0.5`); a kind without params: nothing
    describe: Callable[[P], str] = lambda params: ""


def of_kind(spec: FaultSpec[Any], kind: Kind[P]) -> TypeGuard[FaultSpec[P]]:
    """Whether `spec` is of `kind`: past it, mypy reads `spec.params` as that kind's params (a
    stored spec's params are its kind's: FaultSet.add checks them)."""
    return spec.kind == kind.name
