"""Every id is built and parsed by emulator/model/naming.py: round trips, the supernode prefix,
every malformed form, and the one spelling of a link."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.linkfaults import FaultSet, FaultSpec
from cmemu.emulator.model.linkgraph import LinkGraph
from cmemu.emulator.model.naming import (
    DeviceKind,
    DeviceName,
    DieName,
    LinkName,
    NodeName,
    RackName,
    ServiceName,
    SwitchName,
    Tier,
    device_id,
    device_of,
    die_id,
    die_of,
    directed_link_id,
    l1_switch_id,
    l2_switch_id,
    link_id,
    node_id,
    parse_device,
    parse_die,
    parse_endpoint,
    parse_id,
    parse_link,
    parse_node,
    parse_rack,
    parse_service,
    parse_supernode,
    parse_switch,
    rack_id,
    service_id,
    supernode_id,
)
from cmemu.emulator.model.topology import ServiceKind, build

NPU3 = DeviceName(node=7, kind=DeviceKind.NPU, index=3)


@pytest.mark.parametrize(
    ("text", "record"),
    [
        ("n07", NodeName(index=7)),
        ("n123", NodeName(index=123)),
        ("sn1-n07", NodeName(index=7, supernode=1)),
        ("rack02", RackName(index=2)),
        ("sn1-rack11", RackName(index=11, supernode=1)),
        ("n07-npu3", NPU3),
        ("n07-cpu1", DeviceName(node=7, kind=DeviceKind.CPU, index=1)),
        ("n07-mem", DeviceName(node=7, kind=DeviceKind.MEMPOOL)),
        ("sn1-n07-npu3", DeviceName(node=7, kind=DeviceKind.NPU, index=3, supernode=1)),
        ("sn12-n00-mem", DeviceName(node=0, kind=DeviceKind.MEMPOOL, supernode=12)),
        ("n07-npu3.d1", DieName(device=NPU3, die=1)),
        (
            "sn1-n07-npu3.d0",
            DieName(device=DeviceName(node=7, kind=DeviceKind.NPU, index=3, supernode=1), die=0),
        ),
        ("n07-l1s4", SwitchName(tier=Tier.L1, plane=4, chip=4, node=7)),
        ("sn2-n07-l1s4", SwitchName(tier=Tier.L1, plane=4, chip=4, node=7, supernode=2)),
        ("l2-p3-s11", SwitchName(tier=Tier.L2, plane=3, chip=11, node=None)),
        ("sn1-l2-p3-s11", SwitchName(tier=Tier.L2, plane=3, chip=11, node=None, supernode=1)),
        ("fabric", ServiceName(kind="fabric")),
        ("ems", ServiceName(kind="ems")),
        ("sn1-scheduler", ServiceName(kind="scheduler", supernode=1)),
        ("sn0-gw", ServiceName(kind="gateway")),
        ("sn3-gw", ServiceName(kind="gateway", supernode=3)),
    ],
)
def test_every_id_round_trips(text: str, record: object) -> None:
    parsed = parse_id(text)
    assert parsed == record
    assert parsed.id == str(parsed) == text


def test_builders_and_parsers_agree() -> None:
    assert node_id(7) == "n07" and node_id(7, supernode=1) == "sn1-n07"
    assert device_id("n07", DeviceKind.NPU, 3) == "n07-npu3"
    assert device_id("sn1-n07", DeviceKind.MEMPOOL) == "sn1-n07-mem"
    assert die_id("sn1-n07-npu3", 1) == "sn1-n07-npu3.d1"
    assert l1_switch_id("sn1-n07", 4) == "sn1-n07-l1s4"
    assert l2_switch_id(3, 11) == "l2-p3-s11" and l2_switch_id(3, 11, supernode=1) == (
        "sn1-l2-p3-s11"
    )
    assert service_id("fabric") == "fabric" and service_id("ems", supernode=2) == "sn2-ems"
    assert service_id("gateway") == "sn0-gw"
    assert supernode_id(4) == "sn4" and parse_supernode("sn4") == 4
    assert rack_id(3) == "rack03" and rack_id(3, supernode=1) == "sn1-rack03"
    rack = parse_rack("sn1-rack01")  # with 4 nodes a rack: sn1-n04 .. sn1-n07
    assert [rack.holds(parse_node(n), 4) for n in ("sn1-n03", "sn1-n04", "sn1-n07", "n05")] == [
        False, True, True, False,
    ]  # fmt: skip
    device = parse_device("sn1-n07-npu3")
    assert (device.node, device.index, device.supernode, device.node_id) == (7, 3, 1, "sn1-n07")
    assert parse_die("n07-npu3.d1").device.id == "n07-npu3"
    assert parse_switch("n07-l1s4").node_id == "n07" and parse_switch("l2-p3-s11").node_id is None
    assert parse_endpoint("n07-mem") == parse_device("n07-mem")
    assert parse_endpoint("n07-npu3.d1") == parse_die("n07-npu3.d1")


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        (parse_node, "n7", "n07"),  # too few digits
        (parse_node, "n007", "its one spelling is 'n07'"),
        (parse_node, "sn0-n07", "its one spelling is 'n07'"),  # sn0 takes no prefix
        (parse_node, "sn01-n07", "n07"),
        (parse_node, "N07", "n07"),
        (parse_node, "", "n07"),
        (parse_device, "n07", "n07-npu3"),
        (parse_device, "n07-npu", "n07-npu3"),
        (parse_device, "n07-npu03", "n07-npu3"),
        (parse_device, "n07-gpu3", "n07-npu3"),
        (parse_device, "n07-mem0", "n07-mem"),
        (parse_device, "n07-npu3.d1", "n07-npu3"),
        (parse_device, "sn0-n07-npu3", "its one spelling is 'n07-npu3'"),
        (parse_device, "sn-n07-npu3", "n07-npu3"),
        (parse_device, "n07-npu3 ", "n07-npu3"),
        (parse_die, "n07-npu3", "n07-npu3.d1"),
        (parse_die, "n07-npu3.d", "n07-npu3.d1"),
        (parse_die, "n07-npu3.1", "n07-npu3.d1"),
        (parse_die, "n07-cpu1.d0", "a cpu has no dies"),
        (parse_die, "n07-mem.d0", "a mempool has no dies"),
        (parse_switch, "n07-l1s", "n07-l1s4"),
        (parse_switch, "n07-l2s4", "l2-p3-s11"),
        (parse_switch, "l2-p3", "l2-p3-s11"),
        (parse_switch, "l2-3-11", "l2-p3-s11"),
        (parse_switch, "sn0-l2-p3-s11", "its one spelling is 'l2-p3-s11'"),
        (parse_service, "gw", "sn0-gw"),
        (parse_service, "gateway", "no service 'gateway'"),
        (parse_service, "sn0-fabric", "its one spelling is 'fabric'"),
        (parse_service, "billing", "no service 'billing'"),
        (parse_supernode, "sn", "sn0"),
        (parse_supernode, "n0", "sn0"),
        (parse_rack, "rack2", "rack02"),
        (parse_rack, "rack002", "its one spelling is 'rack02'"),
        (parse_rack, "sn0-rack02", "its one spelling is 'rack02'"),
        (parse_rack, "n02", "rack02"),
        (parse_id, "n07-npu3-x", "a node, rack, device, die, switch or service id"),
        (parse_link, "n00-npu0.d0", "a~b"),
        (parse_link, "a~b~c", "a~b"),
        (parse_link, "a~b>c", "a~b"),
        (parse_link, "a~", "a~b"),
        (parse_link, "a~a", "a~b"),
        (parse_link, "A~b", "a~b"),
    ],
)
def test_malformed_ids_say_what_was_expected(
    parse: Callable[[str], object], text: str, expected: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"expected|spelling") as err:
        parse(text)
    assert expected in str(err.value) and repr(text) in str(err.value)


def test_the_die_or_device_of_an_id() -> None:
    """Ids of every kind are scanned for dies without splitting them by hand."""
    assert die_of("sn1-n07-npu3.d1") == DieName(
        device=DeviceName(node=7, kind=DeviceKind.NPU, index=3, supernode=1), die=1
    )
    for other in ("n07-npu3", "l2-p3-s11", "n07-l1s4", "fabric", "n07-cpu1.d0x"):
        assert die_of(other) is None
    with pytest.raises(InvalidArgumentError, match="has no dies"):
        die_of("n07-cpu1.d0")  # a die's shape on a device that has none: an error, not None
    assert device_of("n07-npu3.d1") == device_of("n07-npu3") == "n07-npu3"
    for bad in ("l2-p3-s11", "n07-npu3.x1", "n7-npu3"):
        with pytest.raises(InvalidArgumentError):
            device_of(bad)


def test_bad_builder_arguments_are_refused() -> None:
    bad: list[Callable[[], object]] = [
        lambda: node_id(-1),
        lambda: device_id("n7", DeviceKind.NPU, 0),
        lambda: die_id("n07-cpu1", 0),
        lambda: l2_switch_id(-1, 0),
        lambda: service_id("billing"),
        lambda: supernode_id(-2),
        lambda: rack_id(-1),
    ]
    for build_bad in bad:
        with pytest.raises(InvalidArgumentError):
            build_bad()


def test_a_link_has_one_spelling() -> None:
    assert link_id("a", "b") == "a~b" and directed_link_id("a", "b") == "a>b"
    assert parse_link("n00-npu0.d0~n00-l1s3") == LinkName(a="n00-npu0.d0", b="n00-l1s3")
    directed = parse_link("n00-l1s3>n00-npu0.d0")
    assert directed.directed and directed.id == "n00-l1s3>n00-npu0.d0"
    assert directed.physical == "n00-l1s3~n00-npu0.d0"


def test_every_link_name_the_emulator_prints_is_a_fault_target() -> None:
    """The topology's physical links (a~b, either order) and the fabric's directed links (a>b,
    as `cmemu links` prints them) all name a link a fault takes; a directed one, its physical
    link (both directions)."""
    topology = build("cm-mini")
    graph = LinkGraph(topology)
    for link in topology.links:
        both = graph.physical(link.id)
        assert graph.physical(link_id(link.b, link.a)) == both
        assert graph.physical(directed_link_id(link.a, link.b)) == both
        assert graph.physical(directed_link_id(link.b, link.a)) == both
    for i, name in enumerate(graph.names):
        assert i in graph.physical(name)
    faults = FaultSet(graph)
    faults.add(FaultSpec(kind="link-down", params=NoParams(), target=graph.names[0]))
    assert not graph.up[list(graph.physical(graph.names[0]))].any()
    assert graph.up.sum() == len(graph.names) - 2
    with pytest.raises(NotFoundError):
        graph.physical("n00-npu0.d0>n01-l1s0")  # well formed, no such link
    with pytest.raises(InvalidArgumentError):
        graph.physical("n00-npu0.d0")


def test_other_supernodes_prefix_every_id() -> None:
    topology = build("cm-mini", supernode="sn1")
    ids = [d.id for d in topology.devices] + [s.id for s in topology.switches]
    ids += [s.id for s in topology.services]
    assert all(i.startswith("sn1-") for i in ids)
    assert all(parse_id(i).supernode == 1 for i in ids)
    # a preset without a scale-out plane has no gateway
    kinds = [k for k in ServiceKind if k is not ServiceKind.GATEWAY]
    assert {s.id for s in topology.services} == {f"sn1-{kind.value}" for kind in kinds}
    graph = LinkGraph(topology)
    route = graph.route(graph.endpoint("sn1-n00-npu0.d0"), graph.endpoint("sn1-n01-npu0"))
    assert [parse_id(h).supernode for h in route.hops] == [1] * 5
