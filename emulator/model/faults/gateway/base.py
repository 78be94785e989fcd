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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.rdmafault import RdmaFault

if TYPE_CHECKING:
    from cmemu.emulator.model.rdmagraph import RdmaGraph

LINK = "an RDMA plane link 'a~b' (die~leaf, leaf~spine, spine~core)"
SWITCH = "an RDMA plane switch (n00-leaf, spine3, sn1-spine3, core5)"


class Effect(Protocol):
    """What one kind does to the plane: `validate` refuses a fault it cannot apply (an unknown
    link, switch or supernode: NotFoundError naming the target) before it is stored; `apply`
    writes it onto the graph (a clean plane plus the faults applied before)."""

    def validate(self, graph: RdmaGraph, fault: RdmaFault) -> None: ...

    def apply(self, graph: RdmaGraph, fault: RdmaFault) -> None: ...


def _none(_: Any) -> dict[str, Any]:
    return {}


def factor_to_fault(params: Any) -> dict[str, Any]:
    """A slow kind's (`factor` in its params and in the fault alike)."""
    return {"factor": params.factor}


def factor_of_fault(fault: RdmaFault) -> dict[str, object]:
    return {"factor": fault.factor}


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One RDMA plane fault kind, as its module declares it: its name on the gateway's API
    (`link-slow`; GatewayFault's kind, the oneof field its params travel in), its name in the
    user's catalogue (`rdma-link-slow`, `cmemu fault kinds`), typed parameters (a frozen
    dataclass; on the wire the message of the same name), help, what its TARGET names, its
    effect on the plane (None: on a gateway), and its wire mapping: `to_fault` turns its params
    into RdmaFault fields, `of_fault` reads them back by the params' names. The client's record
    of the kind is made from this one (emulator/client/faultkinds/gateway.py)."""

    name: str
    catalogue: str
    help: str
    effect: Effect | None
    params: type[Any] = NoParams
    target: str = LINK
    to_fault: Callable[[Any], dict[str, Any]] = _none
    of_fault: Callable[[RdmaFault], dict[str, object]] = _none
