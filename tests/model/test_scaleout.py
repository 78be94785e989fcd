"""The scale-out plane and the documents of a `<base>x<N>` preset (emulator/model/scaleout.py)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, ScaleOutProfile
from cmemu.emulator.model.naming import Tier, parse_id, parse_switch
from cmemu.emulator.model.presets import get_preset
from cmemu.emulator.model.scaleout import (
    build_cluster,
    leaf_spine_bytes_per_s,
    spine_core_bytes_per_s,
    supernode_of,
)
from cmemu.emulator.model.topology import (
    DNS_LABEL,
    RDMA_LINKS,
    LinkKind,
    ServiceKind,
    Topology,
    build,
    server_count,
)

P = DEFAULT_PROFILE


def test_a_multi_supernode_preset_is_made_from_its_base() -> None:
    two = get_preset("cm384x2")
    assert (two.supernodes, two.scaleout, two.base, two.nodes) == (2, True, "cm384", 48)
    seven = get_preset("cm-minix7")  # any N, made on demand
    assert (seven.supernodes, seven.base, seven.source) == (7, "cm-mini", "derived")
    assert get_preset("cm384x1").scaleout  # one supernode with the plane
    assert not get_preset("cm384").scaleout
    for bad in ("cm384x0", "cm999x2", "cm384x2x2", "cm384x"):
        with pytest.raises(UnknownNameError, match=r"known: .*cm384x<N>"):
            get_preset(bad)


def test_every_supernode_has_its_own_ids_addresses_and_services() -> None:
    sn0, sn1 = build_cluster("cm-minix2", plan=LoopbackPlan())
    assert (sn0.supernode, sn1.supernode, sn0.index, sn1.index) == ("sn0", "sn1", 0, 1)
    assert sn1.devices[0].id == "sn1-n00-npu0" and sn0.devices[0].id == "n00-npu0"
    assert [s.id for s in sn1.services] == [
        "sn1-fabric",
        "sn1-ems",
        "sn1-scheduler",
        "sn1-router",
        "sn1-manager",
        "sn1-gw",
    ]
    assert sn0.service(ServiceKind.GATEWAY).id == "sn0-gw"
    addresses = [d.address for t in (sn0, sn1) for d in t.devices]
    addresses += [s.address for t in (sn0, sn1) for s in t.services]
    assert len(set(addresses)) == len(addresses)  # no two servers share an address
    assert sn0.scaleout == sn1.scaleout  # one plane, copied into both documents
    # one supernode's documents are the same as `build` makes, but for the gateway and plane
    alone = build("cm-mini", plan=LoopbackPlan())
    assert [d.id for d in alone.devices] == [d.id for d in sn0.devices]
    assert ServiceKind.GATEWAY not in {s.kind for s in alone.services}
    assert alone.scaleout is None


def test_the_plane_joins_every_npu_die_and_only_them() -> None:
    sn0, sn1 = build_cluster("cm-minix2")
    plane = sn0.scaleout
    assert plane is not None and plane.supernodes == 2
    so = P.scaleout
    kinds = Counter(link.kind for link in plane.links)
    dies = 2 * 16 * P.npu.dies
    assert kinds[LinkKind.RDMA_PORT] == dies  # every die's port; no CPU, no memory pool
    assert kinds[LinkKind.LEAF_SPINE] == 2 * 2 * so.spines_per_supernode
    assert kinds[LinkKind.SPINE_CORE] == 2 * so.spines_per_supernode * so.core_switches
    assert {link.kind for link in plane.links} <= RDMA_LINKS
    assert not RDMA_LINKS & {link.kind for link in sn0.links}  # the UB plane holds no RDMA link
    ports = [link for link in plane.links if link.kind is LinkKind.RDMA_PORT]
    assert {parse_id(link.a).supernode for link in ports} == {0, 1}
    assert all(link.bytes_per_s == P.npu.rdma_bytes_per_s_per_die for link in ports)
    tiers = Counter(parse_switch(s.id).tier for s in plane.switches)
    assert tiers == {Tier.LEAF: 4, Tier.SPINE: 2 * so.spines_per_supernode, Tier.CORE: 16}
    assert all(DNS_LABEL.match(s.id) for s in plane.switches)
    assert [g.id for g in plane.gateways] == ["sn0-gw", "sn1-gw"]
    assert plane.gateway(1).address == sn1.service(ServiceKind.GATEWAY).address
    assert plane.clock == sn0.service(ServiceKind.FABRIC).address  # sn0's epoch is everyone's
    with pytest.raises(NotFoundError, match="sn2"):
        plane.gateway(2)


def test_tier_capacities_follow_the_node_rate_and_oversubscription() -> None:
    node = 8 * 2 * P.npu.rdma_bytes_per_s_per_die  # 3.2 Tbps per node (HARDWARE.md)
    assert node == pytest.approx(3.2e12 / 8)
    so = P.scaleout
    assert leaf_spine_bytes_per_s(P) * so.spines_per_supernode == pytest.approx(node)
    # non-blocking by default: a spine's core links carry what its leaves send it
    nodes = 48
    assert spine_core_bytes_per_s(nodes, P) * so.core_switches == pytest.approx(
        nodes * leaf_spine_bytes_per_s(P)
    )
    squeezed = dataclasses.replace(
        P, scaleout=ScaleOutProfile(leaf_oversubscription=2.0, spine_oversubscription=4.0)
    )
    assert leaf_spine_bytes_per_s(squeezed) == pytest.approx(leaf_spine_bytes_per_s(P) / 2)
    assert spine_core_bytes_per_s(nodes, squeezed) == pytest.approx(
        spine_core_bytes_per_s(nodes, P) / 8
    )


def test_documents_round_trip_through_json_with_the_plane() -> None:
    for topology in build_cluster("cm-minix2"):
        assert Topology.from_json(topology.to_json()) == topology
    single = build("cm-mini")
    assert "scaleout" not in single.to_dict()  # a preset without the plane writes none


def test_supernode_of_finds_the_document_of_any_id() -> None:
    supernodes = build_cluster("cm-minix2")
    for name, index in [
        ("n01-npu3", 0),
        ("sn1-n01-npu3.d1", 1),
        ("sn1-gw", 1),
        ("sn1-fabric", 1),
        ("sn1-n00-leaf", 1),
        ("fabric", 0),
    ]:
        assert supernode_of(name, supernodes).index == index
    with pytest.raises(NotFoundError, match="sn2"):
        supernode_of("sn2-n00-npu0", supernodes)
    with pytest.raises(InvalidArgumentError):
        supernode_of("not an id", supernodes)


def test_addresses_follow_on_across_supernodes() -> None:
    sn0, sn1 = build_cluster("cm-minix2")  # ports: sn1's start after sn0's last
    first = int(sn1.devices[0].address.rpartition(":")[2])
    assert first == int(sn0.devices[0].address.rpartition(":")[2]) + server_count(sn0)


def test_more_supernodes_than_the_plane_joins_are_refused() -> None:
    small = dataclasses.replace(P, scaleout=ScaleOutProfile(max_supernodes=3))
    with pytest.raises(InvalidArgumentError, match="exceed the 3"):
        build_cluster("cm-minix4", profile=small)
    assert len(build_cluster("cm-minix3", profile=small)) == 3
