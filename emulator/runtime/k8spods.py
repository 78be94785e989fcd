"""The pods of a preset on Kubernetes: which servers each runs, what it waits for, when it starts.

A pod serves one device, or one node's devices, or one supernode-wide service (`--per`), as a
compose container does; k8sgen.py writes each as its Deployment and Services. A pod's memory
limit is the compose file's, so that both engines hold it to the same bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cmemu.emulator.model.address import port_of
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.topology import DeviceKind, ServiceKind, Topology
from cmemu.emulator.runtime.composegen import MEM_LIMITS
from cmemu.emulator.runtime.registry import DEVICE_WAVE, spec_of
from cmemu.emulator.runtime.serve import Per, ServeKind


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One pod's worth: what it serves, how it starts, when."""

    name: str
    topology: Topology
    kind: ServeKind
    hosts: tuple[str, ...]  # the device or service ids it serves
    ports: tuple[tuple[str, int], ...]  # (id, gRPC port) of each
    http_port: int | None
    wave: int
    memory_limit: str
    needs: tuple[str, ...]  # addresses its init container waits for
    keeps_files: bool = False


def quantity(compose_mem: str) -> str:
    """A compose mem_limit ("256m", "2g": binary units) as a Kubernetes quantity."""
    units = {"k": "Ki", "m": "Mi", "g": "Gi"}
    number, unit = compose_mem[:-1], compose_mem[-1].lower()
    if unit not in units or not number.isdigit():
        raise InvalidArgumentError(f"memory limit {compose_mem!r}: want a number and k, m or g")
    return f"{number}{units[unit]}"


def workloads(supernodes: tuple[Topology, ...], per: Per) -> Iterator[Workload]:
    first_fabric = supernodes[0].service(ServiceKind.FABRIC)
    for topology in supernodes:
        fabric = topology.service(ServiceKind.FABRIC)
        pools = tuple(d.address for d in topology.of_kind(DeviceKind.MEMPOOL))
        groups = (
            [[d] for d in topology.devices]
            if per == "device"
            else [topology.in_node(node) for node in topology.nodes]
        )
        for group in groups:
            yield Workload(
                name=group[0].id if per == "device" else group[0].node,
                topology=topology,
                kind="device" if per == "device" else "node",
                hosts=tuple(d.id for d in group),
                ports=tuple((d.id, port_of(d.address)) for d in group),
                http_port=None,
                wave=DEVICE_WAVE,
                memory_limit=quantity(MEM_LIMITS[per]),
                needs=(fabric.address,),
            )
        for service in topology.services:
            spec = spec_of(service.kind)
            needs = [x.address for x in topology.services if spec_of(x.kind).wave < spec.wave]
            if spec.after_pools:  # its state is rebuilt from the memory pools
                needs += pools
            if service.kind is ServiceKind.FABRIC and service.id != first_fabric.id:
                needs.append(first_fabric.address)  # it takes sn0's clock
            yield Workload(
                name=service.id,
                topology=topology,
                kind="service",
                hosts=(service.id,),
                ports=((service.id, port_of(service.address)),),
                http_port=port_of(service.http_address) if service.http_address else None,
                wave=spec.wave,
                memory_limit=quantity(spec.mem_limit),
                needs=tuple(needs),
                keeps_files=spec.keeps_files,
            )
