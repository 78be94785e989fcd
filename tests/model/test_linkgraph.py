"""Routes, ceilings and faults on the cm-mini link graph (pure: no servers)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cmemu.emulator.model.collectives import CollectiveTiming, run_collective
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.costmodel import ub_transfer_ns
from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    UnavailableError,
)
from cmemu.emulator.model.faults.fabric import KINDS as FABRIC_KINDS
from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.fabric.link_latency import LinkLatencyParams
from cmemu.emulator.model.faults.fabric.link_loss import LinkLossParams
from cmemu.emulator.model.faults.fabric.optical_module import OpticalModuleParams
from cmemu.emulator.model.faults.fabric.partition import PartitionParams
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.linkfaults import FaultSet, FaultSpec
from cmemu.emulator.model.linkgraph import LinkGraph, validate_ranks
from cmemu.emulator.model.route import Route
from cmemu.emulator.model.topology import DeviceKind, build

GB = 1e9
LINK0 = "n00-npu0.d0~n00-l1s0"


@pytest.fixture
def graph() -> LinkGraph:
    return LinkGraph(build("cm-mini"))


def _route(g: LinkGraph, a: str, b: str) -> Route:
    return g.route(g.endpoint(a), g.endpoint(b))


def test_routes_match_the_calibrated_cost_model(graph: LinkGraph) -> None:
    intra = _route(graph, "n00-npu0.d0", "n00-npu5.d1")
    cross = _route(graph, "n00-npu0.d0", "n01-npu5.d1")
    assert intra.hops == ("n00-npu0.d0", "n00-l1s0", "n00-npu5.d1")
    assert cross.hops[1:4] == ("n00-l1s0", cross.hops[2], "n01-l1s0") and cross.hops[2].startswith(
        "l2-p0-"
    )
    assert (intra.planes, cross.planes) == (7, 7)
    assert intra.cap == pytest.approx(167 * GB)
    assert 0.97 < cross.cap / intra.cap < 1.0  # crossing nodes: under 3% of bandwidth
    assert 0 < cross.latency_s - intra.latency_s < 1e-6  # and under 1 us
    for route, cross_node in ((intra, False), (cross, True)):
        for size in (512, 1 << 30):
            model = ub_transfer_ns(
                size, src=DeviceKind.NPU, dst=DeviceKind.NPU, cross_node=cross_node
            )
            assert (route.latency_s + size / route.cap) * 1e9 == pytest.approx(
                model, abs=1
            )  # ns rounding


def test_the_two_dies_of_a_package_use_their_own_link(graph: LinkGraph) -> None:
    route = _route(graph, "n00-npu3.d0", "n00-npu3.d1")
    assert route.hops == ("n00-npu3.d0", "n00-npu3.d1") and route.planes == 0
    assert route.cap > 167 * GB


def test_memory_pool_traffic_is_spread_over_the_cpus(graph: LinkGraph) -> None:
    route = _route(graph, "n00-npu0.d0", "n01-mem")
    shares = sorted(w for _, w in route.resources)
    assert shares.count(0.25) == 4  # a quarter through each CPU of the pool's node


def test_port_down_degraded_and_latency_faults(graph: LinkGraph) -> None:
    faults = FaultSet(graph)
    before = _route(graph, "n00-npu0.d0", "n00-npu1.d0")
    faults.add(FaultSpec(kind="link-down", params=NoParams(), target="n00-npu0.d0~n00-l1s3"))
    down = _route(graph, "n00-npu0.d0", "n00-npu1.d0")
    assert down.planes == 6 and down.cap == pytest.approx(before.cap * 6 / 7)
    faults.add(
        FaultSpec(
            kind="link-degraded",
            params=LinkDegradedParams(factor=0.5),
            target="n00-l1s5~n00-npu1.d0",
        )
    )
    degraded = _route(graph, "n00-npu0.d0", "n00-npu1.d0")
    assert degraded.cap == pytest.approx(before.cap * 5.5 / 7)
    faults.add(
        FaultSpec(
            kind="link-latency",
            params=LinkLatencyParams(latency_us=2.0),
            target="n00-npu0.d0~n00-l1s0",
        )
    )
    slow = _route(graph, "n00-npu0.d0", "n00-npu1.d0")
    assert slow.latency_s == pytest.approx(before.latency_s + 2e-6)
    faults.clear(all=True)
    assert _route(graph, "n00-npu0.d0", "n00-npu1.d0") == before


def test_an_l1_chip_failure_takes_its_plane_away(graph: LinkGraph) -> None:
    FaultSet(graph).add(FaultSpec(kind="switch-down", params=NoParams(), target="n01-l1s2"))
    route = _route(graph, "n00-npu0.d0", "n01-npu0.d0")
    assert route.planes == 6 and "n01-l1s2" not in route.hops


def test_an_l2_chip_failure_reroutes_and_costs_its_share_of_cross_node_bandwidth(
    graph: LinkGraph,
) -> None:
    ranks0 = [f"n00-npu{i}" for i in range(8)]
    ranks1 = [f"n01-npu{i}" for i in range(8)]
    ranks = validate_ranks(graph, ranks0 + ranks1)
    n = len(ranks)  # 32 dies; every die of node 0 sends 1 MB to every die of node 1
    pairs = [(1 << 20) if i < 16 <= j else 0 for i in range(n) for j in range(n)]
    spec = CollectiveSpec(op="all-to-all", pair_bytes=tuple(pairs))
    healthy = run_collective(graph, ranks, spec)
    victim = next(
        h for h in _route(graph, "n00-npu0.d0", "n01-npu0.d0").hops if h.startswith("l2-")
    )
    FaultSet(graph).add(FaultSpec(kind="switch-down", params=NoParams(), target=victim))
    rerouted = _route(graph, "n00-npu0.d0", "n01-npu0.d0")
    assert victim not in rerouted.hops and rerouted.planes == 7
    degraded = run_collective(graph, ranks, spec)
    # the node's 112 uplinks were the bottleneck; 111 are left
    assert _fluid(degraded) / _fluid(healthy) == pytest.approx(112 / 111, rel=1e-3)


def test_a_lossy_link_keeps_its_goodput_and_waits_for_replays(graph: LinkGraph) -> None:
    """link-loss at rate p: selective-repeat retry leaves (1 - p) of the link's bandwidth and
    adds p/(1-p) replay round trips per crossing (emulator/model/faults/fabric/link_loss.py)."""
    link, p = "n00-npu2.d0~n00-npu2.d1", 0.2  # the die-to-die link: the only path
    before = _route(graph, "n00-npu2.d0", "n00-npu2.d1")
    faults = FaultSet(graph)
    faults.add(FaultSpec(kind="link-loss", params=LinkLossParams(rate=p), target=link))
    lossy = _route(graph, "n00-npu2.d0", "n00-npu2.d1")
    assert lossy.cap == pytest.approx(before.cap * (1 - p))
    replay_s = graph.profile.switch.link_retry_s * p / (1 - p)
    assert lossy.latency_s == pytest.approx(before.latency_s + replay_s)
    faults.add(
        FaultSpec(kind="link-loss", params=LinkLossParams(rate=0.5), target=link)
    )  # two causes compound
    assert _route(graph, "n00-npu2.d0", "n00-npu2.d1").cap == pytest.approx(before.cap * 0.4)
    faults.clear(all=True)
    assert _route(graph, "n00-npu2.d0", "n00-npu2.d1") == before


def test_an_optical_module_takes_its_share_of_the_node_uplinks(graph: LinkGraph) -> None:
    ranks = validate_ranks(graph, [f"n0{n}-npu{i}" for n in range(2) for i in range(8)])
    n = len(ranks)
    pairs = [(1 << 20) if i < 16 <= j else 0 for i in range(n) for j in range(n)]
    spec = CollectiveSpec(op="all-to-all", pair_bytes=tuple(pairs))
    healthy = run_collective(graph, ranks, spec)
    faults = FaultSet(graph)
    faults.add(
        FaultSpec(kind="optical-module", params=OpticalModuleParams(module=1), target="n01-l1s2")
    )
    per_module = graph.profile.switch.uplinks_per_optical_module
    down = [graph.names[i] for i in range(len(graph.names)) if not graph.up[i]]
    assert len(down) == 2 * per_module and all(name.startswith("n01-l1s2>") or
        name.endswith(">n01-l1s2") for name in down)  # fmt: skip
    degraded = run_collective(graph, ranks, spec)
    uplinks = 7 * 16  # the node's uplinks were the bottleneck; a module's 8 are gone
    assert _fluid(degraded) / _fluid(healthy) == pytest.approx(
        uplinks / (uplinks - per_module), rel=1e-3
    )
    faults.clear(all=True)
    assert graph.up.all()


def test_an_l1_board_takes_every_link_of_its_nodes_l1_chips(graph: LinkGraph) -> None:
    faults = FaultSet(graph)
    faults.add(FaultSpec(kind="l1-board", params=NoParams(), target="n01"))
    down = {graph.names[i] for i in range(len(graph.names)) if not graph.up[i]}
    chips = {f"n01-l1s{c}" for c in range(graph.profile.node.l1_chips)}
    touches = {n for n in graph.names if any(c in n.split(">") for c in chips)}
    assert down == touches and down  # exactly the board's chips' links, both directions
    assert not any("n00-" in n and "n01-" not in n for n in down)  # the other node's: all up
    faults.clear(all=True)
    assert graph.up.all()


def _fluid(timing: CollectiveTiming) -> float:
    """How long the bytes took to move, without the fixed latency."""
    return float((timing.flow_bytes / (timing.flow_gb_s * 1e9)).max())


def test_partition_and_dead_routes_are_unavailable(graph: LinkGraph) -> None:
    faults = FaultSet(graph)
    faults.add(
        FaultSpec(
            kind="partition", params=PartitionParams(side_a="n00-npu0", side_b="n01-mem,n01-cpu0")
        )
    )
    with pytest.raises(UnavailableError, match="partitioned"):
        _route(graph, "n00-npu0.d1", "n01-mem")
    _route(graph, "n00-npu1.d0", "n01-mem")  # others are not cut off
    for port in range(7):
        faults.add(
            FaultSpec(kind="link-down", params=NoParams(), target=f"n00-npu2.d0~n00-l1s{port}")
        )
    with pytest.raises(UnavailableError):
        _route(graph, "n00-npu2.d0", "n00-npu4.d0")


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (FaultSpec(kind="meltdown", params=NoParams(), target="x"), InvalidArgumentError),
        (
            FaultSpec(kind="link-down", params=NoParams(), target="n00-npu0.d0~n01-l1s0"),
            NotFoundError,
        ),
        (FaultSpec(kind="switch-down", params=NoParams(), target="l2-p9-s0"), NotFoundError),
        (
            FaultSpec(
                kind="link-degraded",
                params=LinkDegradedParams(factor=1.5),
                target="n00-npu0.d0~n00-l1s0",
            ),
            InvalidArgumentError,
        ),
        (
            FaultSpec(
                kind="link-latency",
                params=LinkLatencyParams(latency_us=0.0),
                target="n00-npu0.d0~n00-l1s0",
            ),
            InvalidArgumentError,
        ),
        (
            FaultSpec(kind="partition", params=PartitionParams(side_a="n00-npu0", side_b="")),
            InvalidArgumentError,
        ),
        (
            FaultSpec(
                kind="partition", params=PartitionParams(side_a="n00-npu0", side_b="n00-npu0")
            ),
            InvalidArgumentError,
        ),
        (
            FaultSpec(kind="partition", params=PartitionParams(side_a="n00-npu0", side_b="nobody")),
            NotFoundError,
        ),
        (
            FaultSpec(
                kind="link-loss", params=LinkLossParams(rate=0.0), target="n00-npu0.d0~n00-l1s0"
            ),
            InvalidArgumentError,
        ),
        (
            FaultSpec(
                kind="link-loss", params=LinkLossParams(rate=1.0), target="n00-npu0.d0~n00-l1s0"
            ),
            InvalidArgumentError,
        ),
        (
            FaultSpec(
                kind="optical-module", params=OpticalModuleParams(module=2), target="n00-l1s0"
            ),
            InvalidArgumentError,
        ),
        (
            FaultSpec(kind="optical-module", params=OpticalModuleParams(), target="l2-p0-s0"),
            InvalidArgumentError,
        ),
        (
            FaultSpec(kind="optical-module", params=OpticalModuleParams(), target="n00-npu0"),
            InvalidArgumentError,
        ),
        (FaultSpec(kind="l1-board", params=NoParams(), target="n00-l1s0"), InvalidArgumentError),
        (FaultSpec(kind="l1-board", params=NoParams(), target="n09"), NotFoundError),
        # params of another kind's class: a catch-all cannot sneak back in
        (FaultSpec(kind="link-degraded", params=NoParams(), target=LINK0), InvalidArgumentError),
        (
            FaultSpec(kind="link-loss", params=LinkDegradedParams(factor=0.5), target=LINK0),
            InvalidArgumentError,
        ),
    ],
)
def test_bad_faults_are_refused_and_change_nothing(
    graph: LinkGraph, spec: FaultSpec[Any], error: type
) -> None:
    faults = FaultSet(graph)
    with pytest.raises(error):
        faults.add(spec)
    assert faults.faults == {} and graph.up.all()


def test_fault_kinds_are_one_table() -> None:
    assert set(FABRIC_KINDS) == {
        "link-down",
        "link-degraded",
        "link-latency",
        "switch-down",
        "partition",
        "link-flap",  # a link-down that toggles in emulated time
        "link-loss",  # frames lost or failing CRC: goodput (1 - p), replays add latency
        "optical-module",  # a bundle of an L1 chip's uplinks down as one
        "l1-board",  # every link of a node's L1 chips down as one
        "ports-degraded",  # a device's own die ports, behind the `slow` device fault
        "rank-down",  # a dead NPU or die as a collective rank, behind crash/die-down/...
        "rank-hung",  # behind hang
        "rank-slow",  # behind slow's compute
    }


def test_bad_endpoints_and_rank_groups(graph: LinkGraph) -> None:
    with pytest.raises(NotFoundError):
        graph.endpoint("n07-npu0")
    with pytest.raises(OutOfRangeError):
        graph.endpoint("n00-npu0.d2")
    with pytest.raises(InvalidArgumentError, match="repeat"):
        validate_ranks(graph, ["n00-npu0", "n00-npu0.d1"])
    with pytest.raises(InvalidArgumentError, match="NPU dies"):
        validate_ranks(graph, ["n00-npu0", "n00-cpu0"])
    with pytest.raises(InvalidArgumentError, match="at least 2"):
        validate_ranks(graph, ["n00-npu0.d0"])


ROUTES_GOLDEN = Path(__file__).parent.parent / "golden" / "cm384.routes.json"
GOLDEN_ROUTES = [
    ("n00-npu0.d0", "n00-npu0.d0"),  # to itself: an HBM copy
    ("n00-npu0.d0", "n00-npu0.d1"),  # sibling dies: the die-to-die link
    ("n05-npu3.d1", "n05-npu3.d0"),
    ("n00-npu0.d0", "n00-npu5.d1"),  # same node: one L1 chip per plane
    ("n00-npu0.d0", "n01-npu5.d1"),  # across nodes: L1, L2, L1
    ("n03-npu7.d1", "n47-npu0.d0"),
    ("n00-npu0.d0", "n00-cpu1"),  # die to CPU
    ("n00-npu2.d1", "n12-cpu3"),
    ("n00-npu0.d0", "n00-mem"),  # die to memory pool
    ("n00-npu0.d0", "n01-mem"),
    ("n47-mem", "n00-npu1.d0"),
    ("n00-cpu0", "n00-mem"),  # CPU to memory pool
    ("n02-cpu2", "n40-mem"),
]


def _golden_routes() -> list[dict[str, object]]:
    graph = LinkGraph(build("cm384"))
    out: list[dict[str, object]] = []
    for src, dst in GOLDEN_ROUTES:
        route = _route(graph, src, dst)
        out.append(
            {
                "src": src,
                "dst": dst,
                "kind": route.kind.value,
                "hops": list(route.hops),
                "planes": route.planes,
                "ceiling_gb_s": round(route.cap / GB, 6),
                "latency_us": round(route.latency_s * 1e6, 6),
            }
        )
    return out


def test_cm384_routes_match_the_golden_file() -> None:
    """A fixed set of cm384 routes (hops, planes, ceiling, latency): any change to routing shows
    up here. Regenerate with CMEMU_UPDATE_GOLDEN=1 after checking the diff."""
    current = _golden_routes()
    if os.environ.get("CMEMU_UPDATE_GOLDEN"):
        ROUTES_GOLDEN.write_text(json.dumps(current, indent=1) + "\n")
    assert current == json.loads(ROUTES_GOLDEN.read_text())


def test_every_spelling_of_a_link_finds_both_its_directions(graph: LinkGraph) -> None:
    """physical() reads both directions off either one's index (2k and 2k + 1): each of the
    four spellings of every link gives the pair, the first named as the topology names it."""
    for link in graph.topology.links:
        pair = graph.physical(f"{link.a}~{link.b}")
        assert graph.names[pair[0]] == f"{link.a}>{link.b}"
        assert graph.names[pair[1]] == f"{link.b}>{link.a}"
        for spelling in (f"{link.b}~{link.a}", f"{link.a}>{link.b}", f"{link.b}>{link.a}"):
            assert graph.physical(spelling) == pair
    first = graph.topology.links[0]
    with pytest.raises(NotFoundError, match="no link"):
        graph.physical(f"{first.a}~{graph.topology.links[-1].b}")  # two ends, no link between


def test_a_switchs_links_are_every_directed_link_with_it_at_an_end(graph: LinkGraph) -> None:
    """Made at the first switch fault, not kept from the start (issue 18's memory): each
    switch's table is every directed link that has it at either end, both directions; an
    unknown switch is NOT_FOUND."""
    for switch in ("n01-l1s2", "l2-p0-s0"):
        expected = [i for i, (a, b) in enumerate(graph.ends) if switch in (a, b)]
        assert graph.switch_links(switch) == expected
        assert len(expected) % 2 == 0 and expected  # a link's two directions
    with pytest.raises(NotFoundError, match="no switch"):
        graph.switch_links("n09-l1s0")
