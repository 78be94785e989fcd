"""optical-module: an optical module of an L1 chip fails: the bundle of uplinks it carries to
the L2 tier goes down at once (one fault, cleared as one); the chip's links inside the node stay
up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.errors import InvalidArgumentError, quote
from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import AT_LEAST_ZERO, param
from cmemu.emulator.model.naming import Tier, parse_switch
from cmemu.emulator.model.topology import LinkKind

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph


@dataclass(frozen=True, kw_only=True)
class OpticalModuleParams:
    module: int = param(
        0,
        "which of the L1 chip's uplink modules fails, from 0; each carries "
        "switch.uplinks_per_optical_module uplinks, in L2 chip order",
        AT_LEAST_ZERO,
    )


def optical_module_links(graph: LinkGraph, switch_id: str, module: int) -> list[int]:
    """Both directions of the uplinks one optical module of an L1 chip carries: the chip's
    links to the L2 chips of its sub-plane, `uplinks_per_optical_module` to a module, in L2
    chip order."""
    links = graph.switch_links(switch_id)
    uplinks = [i for i in links if graph.kinds[i] is LinkKind.L1_L2]
    if not uplinks or parse_switch(switch_id).tier is not Tier.L1:
        raise InvalidArgumentError(
            f"{quote(switch_id)} has no uplinks: an optical module is an L1 chip's (n00-l1s3)",
            field="target",
            subject=switch_id,
        )
    per = graph.profile.switch.uplinks_per_optical_module * 2  # both directions of each link
    modules = -(-len(uplinks) // per)
    if not 0 <= module < modules:
        raise InvalidArgumentError(
            f"{switch_id} has optical modules 0 to {modules - 1}, not {module}",
            field="params.module",
            subject=switch_id,
        )
    return uplinks[module * per : (module + 1) * per]


@dataclass(frozen=True)
class OpticalModule:
    def validate(self, graph: LinkGraph, spec: FaultSpec[OpticalModuleParams]) -> None:
        optical_module_links(graph, spec.target, spec.params.module)

    def apply(self, graph: LinkGraph, spec: FaultSpec[OpticalModuleParams]) -> None:
        graph.up[optical_module_links(graph, spec.target, spec.params.module)] = False


def describe(params: OpticalModuleParams) -> str:
    return f"module={params.module}"


KIND = Kind(
    name="optical-module",
    help="an optical module of an L1 chip fails: the uplinks it carries go down at once",
    params=OpticalModuleParams,
    effect=OpticalModule(),
    target="an L1 chip id (e.g. n03-l1s4)",
    describe=describe,
)
