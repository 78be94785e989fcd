"""What every RDMA plane (gateway) fault kind shares: the Effect contract on the plane's graph
and the kind record each kind's module declares (Kind). The kinds are one module each beside
this one, registered in __init__.py KINDS; RdmaFaultSet (emulator/model/rdmagraph.py) runs the
plane's (an id, a duration, re-applying every fault to a clean plane), the gateway engine
(emulator/engines/gateway/faults.py) routes each to whoever holds it.

Pure graph code, so the model layer: an effect writes the plane graph's `up`, `factor` and
`cut` and nothing else. gateway-down alone acts on a gateway rather than the plane (it refuses
RDMA, an async engine's state): its effect is None here and its gateway applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeGuard, TypeVar

from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.rdmafault import RdmaFault

if TYPE_CHECKING:
    from cmemu.emulator.model.rdmagraph import RdmaGraph

__all__ = ["LINK", "SWITCH", "Effect", "Kind", "NoParams", "of_kind"]

LINK = "an RDMA plane link 'a~b' (die~leaf, leaf~spine, spine~core)"
SWITCH = "an RDMA plane switch (n00-leaf, spine3, sn1-spine3, core5)"

P = TypeVar("P")  # a kind's params dataclass


class Effect(Protocol[P]):
    """What one kind does to the plane: `validate` refuses a fault it cannot apply (an unknown
    link, switch or supernode: NotFoundError naming the target) before it is stored; `apply`
    writes it onto the graph (a clean plane plus the faults applied before). Both take the
    kind's own params type, so mypy checks each effect against its kind's fields."""

    def validate(self, graph: RdmaGraph, fault: RdmaFault[P]) -> None: ...

    def apply(self, graph: RdmaGraph, fault: RdmaFault[P]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Kind(Generic[P]):
    """One RDMA plane fault kind, as its module declares it: its name on the gateway's API
    (`link-slow`; GatewayFault's kind, the oneof field its params travel in), its name in the
    user's catalogue (`rdma-link-slow`, `cmemu fault kinds`), typed parameters (a frozen
    dataclass; on the wire the message of the same name, mapped field by field by
    emulator/client/wire/faultparams.py for every kind alike), help, what its TARGET names and
    its effect on the plane (None: on a gateway), typed by its params. The client's record of
    the kind is made from this one (emulator/client/faultkinds/gateway.py)."""

    name: str
    catalogue: str
    help: str
    effect: Effect[P] | None
    params: type[P]
    target: str = LINK


def of_kind(fault: RdmaFault[Any], kind: Kind[P]) -> TypeGuard[RdmaFault[P]]:
    """Whether `fault` is of `kind`: past it, mypy reads `fault.params` as that kind's params (a
    stored fault's params are its kind's: RdmaFaultSet.add checks them)."""
    return fault.kind == kind.name
