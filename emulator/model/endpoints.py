"""Where a flow starts or ends on the fabric: an NPU die, a CPU, or a memory pool, with the trunks
it loads and its UB ports per plane.

A memory pool has no ports of its own: it is reached through its node's CPUs, so its endpoint
loads its own trunk fully and each CPU's trunk by an equal share, and its ports are theirs.
The rows (`Endpoint.row`) number the endpoints for the routing rules' arrays
(LinkGraph.port_caps), and `port_tables` lists every port by its (row, plane) cell.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.naming import die_id, trunk_id
from cmemu.emulator.model.route import Incidence, local_bytes_per_s
from cmemu.emulator.model.topology import Device, DeviceKind, Topology

PlanePorts = tuple[tuple[int, ...], ...]  # per plane: directed link indices
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where a flow starts or ends: an NPU die, a CPU, or a memory pool."""

    name: str
    row: int  # its row in LinkGraph.port_caps()
    device: Device
    out: Incidence
    inn: Incidence
    out_ports: PlanePorts  # per plane: the directed links leaving on it
    in_ports: PlanePorts
    local_bytes_per_s: float  # a transfer to itself: HBM or DRAM copy


def build_endpoints(
    topology: Topology,
    profile: HardwareProfile,
    *,
    planes: int,
    trunk: Callable[[str], int],
    outgoing: Mapping[str, PlanePorts],
    incoming: Mapping[str, PlanePorts],
) -> dict[str, Endpoint]:
    """Every endpoint by name (a die "n00-npu3.d1", a CPU, a pool), rows in that order: `trunk`
    gives a trunk's index by name, `outgoing`/`incoming` each device's UB ports per plane."""
    endpoints: dict[str, Endpoint] = {}
    none: PlanePorts = tuple(() for _ in range(planes))

    def add(name: str, device: Device, local_bytes_per_s: float) -> None:
        endpoints[name] = Endpoint(
            name=name,
            row=len(endpoints),
            device=device,
            out=((trunk(trunk_id(name, "out")), 1.0),),
            inn=((trunk(trunk_id(name, "in")), 1.0),),
            out_ports=outgoing.get(name, none),
            in_ports=incoming.get(name, none),
            local_bytes_per_s=local_bytes_per_s,
        )

    for d in topology.devices:
        if d.kind is DeviceKind.NPU:
            for die in range(profile.npu.dies):
                add(die_id(d.id, die), d, local_bytes_per_s(profile, topology, d))
        elif d.kind is DeviceKind.CPU:
            add(d.id, d, local_bytes_per_s(profile, topology, d))
    for d in topology.of_kind(DeviceKind.MEMPOOL):
        cpus = [endpoints[c.id] for c in topology.in_node(d.node) if c.kind is DeviceKind.CPU]
        share = 1.0 / len(cpus)
        endpoints[d.id] = Endpoint(
            name=d.id,
            row=len(endpoints),
            device=d,
            out=((trunk(trunk_id(d.id, "out")), 1.0), *((c.out[0][0], share) for c in cpus)),
            inn=((trunk(trunk_id(d.id, "in")), 1.0), *((c.inn[0][0], share) for c in cpus)),
            out_ports=tuple(tuple(i for c in cpus for i in c.out_ports[p]) for p in range(planes)),
            in_ports=tuple(tuple(i for c in cpus for i in c.in_ports[p]) for p in range(planes)),
            local_bytes_per_s=local_bytes_per_s(profile, topology, d),
        )
    return endpoints


def port_tables(
    endpoints: Mapping[str, Endpoint], planes: int
) -> tuple[list[IntArray], list[IntArray]]:
    """Every port as (cell: endpoint row * planes + plane, directed link), out and in."""
    cells: tuple[list[int], list[int]] = ([], [])
    links: tuple[list[int], list[int]] = ([], [])
    for e in endpoints.values():
        for side, table in enumerate((e.out_ports, e.in_ports)):
            for plane, members in enumerate(table):
                cells[side].extend([e.row * planes + plane] * len(members))
                links[side].extend(members)
    return (
        [np.array(c, dtype=np.int64) for c in cells],
        [np.array(x, dtype=np.int64) for x in links],
    )
