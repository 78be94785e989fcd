"""ports-degraded: a slow device's own UB ports keep `factor` of their bandwidth (both dies of
an NPU, or one die). Set at the fabric by a device's slow fault with link < 1
(emulator/engines/device/kinds/slow.py) and cleared with it: no kind of the user's catalogue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import FRACTION, param
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.model.linkgraph import LinkGraph

NAME = "ports-degraded"


@dataclass(frozen=True, kw_only=True)
class PortsDegradedParams:
    factor: float = param(help="share of the device's UB port bandwidth left, in (0, 1)",
                          check=FRACTION)  # fmt: skip


def device_ports(graph: LinkGraph, target: str) -> list[int]:
    """Every directed port link of a device (both dies of an NPU) or of one die."""
    names = [target]
    device = graph.topology.device(target) if "." not in target else None
    if device is not None and device.kind is DeviceKind.NPU:
        names = [die_id(device.id, d) for d in range(graph.profile.npu.dies)]
    links: list[int] = []
    for name in names:
        endpoint = graph.endpoint(name)
        for table in (endpoint.out_ports, endpoint.in_ports):
            links.extend(i for plane in table for i in plane)
    return links


@dataclass(frozen=True)
class PortsDegraded:
    def validate(self, graph: LinkGraph, spec: FaultSpec[PortsDegradedParams]) -> None:
        device_ports(graph, spec.target)

    def apply(self, graph: LinkGraph, spec: FaultSpec[PortsDegradedParams]) -> None:
        graph.factor[device_ports(graph, spec.target)] *= spec.params.factor


def describe(params: PortsDegradedParams) -> str:
    return f"factor={params.factor:g}"


KIND = Kind(
    name=NAME,
    help="a device's own UB ports keep a share of their bandwidth (its slow fault's link share)",
    params=PortsDegradedParams,
    effect=PortsDegraded(),
    target="a device id, or an NPU die (n00-npu3.d1)",
    from_device=True,
    describe=describe,
)
