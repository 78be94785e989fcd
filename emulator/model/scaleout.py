"""The RDMA scale-out plane and the supernodes it joins: the documents of a `<base>x<N>` preset.

The plane is a three-tier Clos, as RoCE clusters are built: every NPU die's RDMA port goes to its
node's leaf, every leaf to each spine of its supernode, every spine to each core switch, and the
core joins the supernodes. Only the port rate is published (200 Gbps per die, 3.2 Tbps per node);
the tiers' sizes and oversubscription are the profile's assumed figures (`ScaleOutProfile`), so
that a user can make the core a bottleneck and watch what it does.

Each supernode keeps its own UB plane, fabric and services; the plane is the one thing they
share, so every supernode's document carries the same copy of it (with every gateway's address).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from cmemu.emulator.model.addressplans import AddressPlan, PortPlan
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.naming import (
    Tier,
    core_switch_id,
    die_id,
    leaf_switch_id,
    parse_id,
    spine_switch_id,
    supernode_id,
)
from cmemu.emulator.model.presets import Preset, get_preset
from cmemu.emulator.model.topology import (
    DeviceKind,
    Link,
    LinkKind,
    ScaleOut,
    ServiceKind,
    Switch,
    Topology,
    build,
    server_count,
)


def leaf_spine_bytes_per_s(profile: HardwareProfile) -> float:
    """One leaf -> spine link: the node's RDMA rate spread over the spines, oversubscribed."""
    so = profile.scaleout
    node = profile.node.npus * profile.npu.dies * profile.npu.rdma_bytes_per_s_per_die
    return node / so.spines_per_supernode / so.leaf_oversubscription


def spine_core_bytes_per_s(nodes: int, profile: HardwareProfile) -> float:
    """One spine -> core link: what the spine's leaves send it, over the core, oversubscribed."""
    so = profile.scaleout
    return nodes * leaf_spine_bytes_per_s(profile) / so.core_switches / so.spine_oversubscription


def _switches(topology: Topology, profile: HardwareProfile) -> Iterator[Switch]:
    sn = topology.index
    for node in topology.nodes:
        yield Switch(id=leaf_switch_id(node), tier=Tier.LEAF.value, plane=0, node=node)
    for chip in range(profile.scaleout.spines_per_supernode):
        yield Switch(
            id=spine_switch_id(chip, supernode=sn), tier=Tier.SPINE.value, plane=0, node=None
        )


def _links(topology: Topology, profile: HardwareProfile) -> Iterator[Link]:
    sn, so = topology.index, profile.scaleout
    for npu in topology.of_kind(DeviceKind.NPU):
        for die in range(profile.npu.dies):
            yield Link(
                a=die_id(npu.id, die),
                b=leaf_switch_id(npu.node),
                kind=LinkKind.RDMA_PORT,
                bytes_per_s=profile.npu.rdma_bytes_per_s_per_die,
            )
    spines = [spine_switch_id(chip, supernode=sn) for chip in range(so.spines_per_supernode)]
    for node in topology.nodes:
        for spine in spines:
            yield Link(
                a=leaf_switch_id(node),
                b=spine,
                kind=LinkKind.LEAF_SPINE,
                bytes_per_s=leaf_spine_bytes_per_s(profile),
            )
    for spine in spines:
        for chip in range(so.core_switches):
            yield Link(
                a=spine,
                b=core_switch_id(chip),
                kind=LinkKind.SPINE_CORE,
                bytes_per_s=spine_core_bytes_per_s(len(topology.nodes), profile),
            )


def plane(supernodes: tuple[Topology, ...], profile: HardwareProfile) -> ScaleOut:
    """The plane joining these supernodes (each document's gateway among its services)."""
    switches = [s for t in supernodes for s in _switches(t, profile)]
    switches += [
        Switch(id=core_switch_id(chip), tier=Tier.CORE.value, plane=0, node=None)
        for chip in range(profile.scaleout.core_switches)
    ]
    return ScaleOut(
        supernodes=len(supernodes),
        switches=tuple(switches),
        links=tuple(link for t in supernodes for link in _links(t, profile)),
        gateways=tuple(t.service(ServiceKind.GATEWAY) for t in supernodes),
        clock=supernodes[0].service(ServiceKind.FABRIC).address,
    )


def build_cluster(
    preset: Preset | str,
    *,
    plan: AddressPlan | None = None,
    time_scale: float = 1.0,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> tuple[Topology, ...]:
    """The documents of every supernode of a preset, addressed one after another, each carrying
    the plane (a preset without one gives one document, as topology.build does)."""
    spec = get_preset(preset) if isinstance(preset, str) else preset
    plan = plan or PortPlan()
    if not spec.scaleout:
        return (build(spec, plan=plan, time_scale=time_scale, profile=profile),)
    limit = profile.scaleout.max_supernodes
    if spec.supernodes > limit:
        raise InvalidArgumentError(
            f"preset {spec.name}: {spec.supernodes} supernodes exceed the {limit} the scale-out "
            "plane joins"
        )
    built: list[Topology] = []
    ordinal = 0
    for index in range(spec.supernodes):
        topology = build(
            spec,
            plan=plan,
            time_scale=time_scale,
            supernode=supernode_id(index),
            profile=profile,
            first_ordinal=ordinal,
        )
        ordinal += server_count(topology)
        built.append(topology)
    joined = plane(tuple(built), profile)
    return tuple(dataclasses.replace(t, scaleout=joined) for t in built)


def check_ub_within(a: str, b: str) -> int:
    """The supernode of two UB ends, refusing ends in two: UB never crosses supernodes (its
    EIDs name devices of one supernode), RDMA does, through the gateways."""
    first, second = parse_id(a).supernode, parse_id(b).supernode
    if first != second:
        raise InvalidArgumentError(
            f"UB never crosses supernodes: {a} is in sn{first}, {b} in sn{second}; RDMA "
            "joins them (the gateways: `cmemu rdma`)",
            reason="CROSS_SUPERNODE",
        )
    return first


def supernode_of(name: str, supernodes: tuple[Topology, ...]) -> Topology:
    """The document of the supernode an id (device, die, node, switch, service) belongs to."""
    index = parse_id(name).supernode
    if not 0 <= index < len(supernodes):
        raise NotFoundError(f"{quote(name)}: no supernode sn{index} in this launch", subject=name)
    return supernodes[index]
