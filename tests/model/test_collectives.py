"""One router: a collective's flows (DieFlows, vectorised) and a single transfer's route
(LinkGraph.route) take their ceilings, latencies and trunks from the same rules, with and without
faults."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cmemu.emulator.model.collectives import DieFlows, Phase, run_collective
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.fabric.link_latency import LinkLatencyParams
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.linkfaults import FaultSet, FaultSpec
from cmemu.emulator.model.linkgraph import LinkGraph, validate_ranks
from cmemu.emulator.model.naming import directed_link_id, l2_switch_id, link_id
from cmemu.emulator.model.route import RouteKind
from cmemu.emulator.model.topology import build

FAULTS: dict[str, list[FaultSpec[Any]]] = {
    "healthy": [],
    "die port down": [
        FaultSpec(kind="link-down", params=NoParams(), target="n00-npu0.d0~n00-l1s3")
    ],
    "uplink down": [FaultSpec(kind="link-down", params=NoParams(), target="n00-l1s2~l2-p2-s5")],
    "L2 chip down": [FaultSpec(kind="switch-down", params=NoParams(), target="l2-p4-s9")],
    "L1 chip down": [FaultSpec(kind="switch-down", params=NoParams(), target="n01-l1s6")],
    "die port slow": [
        FaultSpec(
            kind="link-latency",
            params=LinkLatencyParams(latency_us=3.0),
            target="n00-npu1.d1>n00-l1s0",
        )
    ],
    "uplink slow": [
        FaultSpec(
            kind="link-latency",
            params=LinkLatencyParams(latency_us=1.0),
            target="n01-l1s1~l2-p1-s0",
        )
    ],
    "die-to-die slow and degraded": [
        FaultSpec(
            kind="link-latency",
            params=LinkLatencyParams(latency_us=2.0),
            target="n00-npu2.d0~n00-npu2.d1",
        ),
        FaultSpec(
            kind="link-degraded",
            params=LinkDegradedParams(factor=0.5),
            target="n01-npu4.d1>n01-npu4.d0",
        ),
    ],
    "port degraded": [
        FaultSpec(
            kind="link-degraded",
            params=LinkDegradedParams(factor=0.3),
            target="n01-npu7.d0~n01-l1s4",
        )
    ],
    # plane 0 across nodes: n00 keeps only its link to chip 0, n01 every link but that one
    "no common L2 chip on a plane": [
        FaultSpec(
            kind="link-down", params=NoParams(), target=link_id("n00-l1s0", l2_switch_id(0, chip))
        )
        for chip in range(1, DEFAULT_PROFILE.switch.l2_chips_per_plane)
    ]
    + [FaultSpec(kind="link-down", params=NoParams(), target="n01-l1s0~l2-p0-s0")],
}


@pytest.mark.parametrize("case", sorted(FAULTS))
def test_collective_flows_and_single_routes_agree(case: str) -> None:
    graph = LinkGraph(build("cm-mini"))
    faults = FaultSet(graph)
    for spec in FAULTS[case]:
        faults.add(spec)
    ranks = validate_ranks(graph, [d.id for d in graph.topology.devices if d.kind == "npu"])
    n = len(ranks)
    src, dst = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    keep = src != dst
    phase = Phase(src[keep], dst[keep], np.ones(int(keep.sum())))
    batch = DieFlows(graph, ranks).batch(phase)
    kinds = set()
    for f, (i, j) in enumerate(zip(phase.src.tolist(), phase.dst.tolist(), strict=True)):
        route = graph.route(ranks[i], ranks[j])
        kinds.add(route.kind)
        where = f"{ranks[i].name} -> {ranks[j].name}"
        assert batch.flow_cap[f] == pytest.approx(route.cap, rel=1e-12), where
        assert batch.latency_s[f] == pytest.approx(route.latency_s, rel=1e-12), where
        trunks = sorted(batch.inc_res[batch.inc_flow == f].tolist())
        # a die's own trunks carry all of its flow: shares of 1 (a pool's would be split)
        assert trunks == sorted(t for t, _ in route.resources), where
    assert kinds == {RouteKind.SIBLING, RouteKind.SAME_NODE, RouteKind.CROSS_NODE}


def test_a_plane_without_a_common_l2_chip_carries_nothing_across_nodes() -> None:
    graph = LinkGraph(build("cm-mini"))
    faults = FaultSet(graph)
    healthy = graph.route(graph.endpoint("n00-npu0.d0"), graph.endpoint("n01-npu0.d0"))
    for spec in FAULTS["no common L2 chip on a plane"]:
        faults.add(spec)
    cut = graph.route(graph.endpoint("n00-npu0.d0"), graph.endpoint("n01-npu0.d0"))
    assert (healthy.planes, cut.planes) == (7, 6)
    assert cut.cap == pytest.approx(healthy.cap * 6 / 7)
    same = graph.route(graph.endpoint("n00-npu0.d0"), graph.endpoint("n00-npu1.d0"))
    assert same.planes == 7  # inside the node the plane still works


def test_collective_uses_the_profiles_top_k() -> None:
    graph = LinkGraph(build("cm-mini"))
    ranks = validate_ranks(graph, [f"n00-npu{i}" for i in range(4)])
    default = run_collective(graph, ranks, CollectiveSpec(op="moe-dispatch", tokens_per_rank=128))
    explicit = run_collective(
        graph,
        ranks,
        CollectiveSpec(op="moe-dispatch", tokens_per_rank=128, top_k=DEFAULT_PROFILE.moe.top_k),
    )
    assert default.total_bytes == explicit.total_bytes
    assert default.duration_s == pytest.approx(116e-6, rel=0.01)
    half = run_collective(
        graph, ranks, CollectiveSpec(op="moe-dispatch", tokens_per_rank=128, top_k=4)
    )
    assert half.total_bytes == pytest.approx(default.total_bytes / 2)


def test_sibling_route_names_its_directed_link() -> None:
    graph = LinkGraph(build("cm-mini"))
    a, b = graph.endpoint("n00-npu3.d0"), graph.endpoint("n00-npu3.d1")
    link = graph.die_link(a, b)
    assert link is not None and graph.trunk_names[link[0]] == directed_link_id(a.name, b.name)
    assert graph.die_link(a, graph.endpoint("n00-npu4.d1")) is None


def test_duplicate_ranks_are_found_in_linear_time() -> None:
    import time

    from cmemu.emulator.model.errors import InvalidArgumentError

    graph = LinkGraph(build("cm-mini"))
    started = time.perf_counter()
    with pytest.raises(InvalidArgumentError) as err:
        validate_ranks(graph, ["n00-npu0.d0"] * 100_000)
    assert time.perf_counter() - started < 0.5
    assert "repeat" in str(err.value) and len(str(err.value)) < 400
    with pytest.raises(InvalidArgumentError):
        validate_ranks(graph, ["n00-npu0.d0", "n00-npu0"])


@pytest.mark.parametrize(
    "spec",
    [
        CollectiveSpec(op="all-gather", bytes=2**64 - 1),
        CollectiveSpec(op="broadcast", bytes=2**64 - 1),
        CollectiveSpec(op="all-to-all", bytes_per_pair=2**64 - 1),
        CollectiveSpec(op="moe-dispatch", tokens_per_rank=2**32 - 1, top_k=2**32 - 1),
        CollectiveSpec(op="moe-combine", tokens_per_rank=10**6, bytes_per_token=2**64 - 1),
    ],
)
def test_a_collective_larger_than_the_memory_of_its_ranks_is_out_of_range(
    spec: CollectiveSpec,
) -> None:
    from cmemu.emulator.model.errors import OutOfRangeError

    graph = LinkGraph(build("cm-mini"))
    ranks = validate_ranks(graph, ["n00-npu0", "n01-npu0"])
    with pytest.raises(OutOfRangeError):
        run_collective(graph, ranks, spec)


def test_a_collective_longer_than_the_ceiling_is_refused() -> None:
    import dataclasses

    from cmemu.emulator.model.emulatorprofile import EmulatorLimits
    from cmemu.emulator.model.errors import OutOfRangeError

    profile = dataclasses.replace(DEFAULT_PROFILE, limits=EmulatorLimits(operation_max_s=1e-3))
    graph = LinkGraph(build("cm-mini", profile=profile), profile)
    ranks = validate_ranks(graph, ["n00-npu0", "n01-npu0"])
    with pytest.raises(OutOfRangeError) as err:
        run_collective(graph, ranks, CollectiveSpec(op="all-gather", bytes=1 << 30))
    assert err.value.reason == "OPERATION_TOO_LONG"
