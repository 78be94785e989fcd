"""The fabric's flow-level timing against every published calibration row (HARDWARE.md): the four
UB rows (read and write, of NPU memory and of CPU memory) and the MoE dispatch and combine at EP8
and EP256. Pure: the link graph and the flow engine the fabric runs, without servers."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.collectives import (
    fit_moe_overhead,
    moe_ranks,
    run_collective,
)
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.costmodel import (
    UbOp,
    moe_overhead_s,
    moe_points,
    ub_point,
    ub_transfer_ns,
    ub_wire_cost,
)
from cmemu.emulator.model.errors import OutOfRangeError
from cmemu.emulator.model.flowsim import LiveFlows
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.linkgraph import LinkGraph
from cmemu.emulator.model.route import priced
from cmemu.emulator.model.topology import DeviceKind, build

GB = 1e9
BIG = 1 << 30
# (op, issuer, target, published GB/s, published ns for 512 bytes): per die, inside one node
ROWS = [
    (UbOp.READ, "n00-npu0.d0", "n00-npu1.d0", 167, 1200),
    (UbOp.WRITE, "n00-npu0.d0", "n00-npu1.d0", 137, 1300),
    (UbOp.READ, "n00-npu0.d0", "n00-mem", 151, 1000),
    (UbOp.WRITE, "n00-npu0.d0", "n00-mem", 110, 1100),
    # CPU memory at a socket's own EID: the same rows (its ports were derated twice, by the
    # dies' efficiency and by the cost of CPU memory: 123 and 90 GB/s, issue 23)
    (UbOp.READ, "n00-npu0.d0", "n00-cpu0", 151, 1000),
    (UbOp.WRITE, "n00-npu0.d0", "n00-cpu0", 110, 1100),
]


@pytest.fixture(scope="module")
def mini() -> LinkGraph:
    return LinkGraph(build("cm-mini"))


@pytest.fixture(scope="module")
def cm384() -> LinkGraph:
    return LinkGraph(build("cm384"))


def _fabric_s(graph: LinkGraph, op: UbOp, issuer: str, target: str, size: int) -> float:
    """One transaction alone on the fabric, timed as FabricState.run_flow times it: the route the
    data takes (a read's comes back from the target), priced by op and target, run as a live
    flow; the completion instant plus the route's latency."""
    src, dst = graph.endpoint(issuer), graph.endpoint(target)
    data_from, data_to = (dst, src) if op is UbOp.READ else (src, dst)
    route = priced(graph.route(data_from, data_to), op, dst.device.kind, graph.profile)
    live = LiveFlows(res_cap=graph.trunk_cap())
    live.add(0.0, route.resources, route.cap, float(size))
    ((_, fluid_end_s),) = live.advance(10.0)
    return fluid_end_s + route.latency_s


@pytest.mark.parametrize("row", ROWS)
def test_one_transfer_on_the_fabric_reproduces_each_published_row(
    mini: LinkGraph, row: tuple[UbOp, str, str, float, float]
) -> None:
    op, issuer, target, gb_s, small_ns = row
    small = _fabric_s(mini, op, issuer, target, 512)
    big = _fabric_s(mini, op, issuer, target, BIG)
    assert small * 1e9 == pytest.approx(small_ns, abs=0.5)
    assert (BIG - 512) / (big - small) == pytest.approx(gb_s * GB, rel=1e-9)
    kind = mini.endpoint(target).device.kind
    for size, fabric in ((512, small), (BIG, big)):  # the closed form agrees
        model = ub_transfer_ns(size, src=DeviceKind.NPU, dst=kind, cross_node=False, op=op)
        assert model == pytest.approx(fabric * 1e9, abs=1)


def _shared_gb_s(graph: LinkGraph, issuers: list[str], target: str) -> float:
    """Aggregate GB/s of reads of `target`'s memory by several dies at once."""
    live = LiveFlows(res_cap=graph.trunk_cap())
    dst = graph.endpoint(target)
    for issuer in issuers:
        route = priced(
            graph.route(dst, graph.endpoint(issuer)), UbOp.READ, DeviceKind.CPU, graph.profile
        )
        live.add(0.0, route.resources, route.cap, float(BIG))
    ends = [end for _, end in live.advance(100.0)]
    return len(issuers) * BIG / max(ends) / GB


def test_dies_reading_one_socket_share_its_160_gb_s_and_a_pool_spreads_them(
    mini: LinkGraph,
) -> None:
    """One die alone reads a socket's memory at the published 151 GB/s (ROWS); four dies of four
    NPUs share the socket's 160 GB/s of reads, where the node's pool, striped over its four
    sockets, gives each its 151."""
    dies = [f"n00-npu{i}.d0" for i in range(4)]
    socket = DEFAULT_PROFILE.cpu.ub_bytes_per_s / GB
    assert _shared_gb_s(mini, dies, "n00-cpu0") == pytest.approx(socket, rel=1e-6)
    assert _shared_gb_s(mini, dies, "n00-mem") == pytest.approx(4 * 151, rel=1e-6)


@pytest.mark.parametrize("row", ROWS)
def test_crossing_nodes_costs_every_op_under_1_us_and_under_3_percent(
    mini: LinkGraph, row: tuple[UbOp, str, str, float, float]
) -> None:
    op, issuer, target, _, _ = row
    far = target.replace("n00-", "n01-")
    extra = _fabric_s(mini, op, issuer, far, 512) - _fabric_s(mini, op, issuer, target, 512)
    assert 0 < extra < 1e-6
    near = _fabric_s(mini, op, issuer, target, BIG)
    assert 0 < 1 - near / _fabric_s(mini, op, issuer, far, BIG) < 0.03


def test_atomics_and_sends_are_priced_as_writes() -> None:
    for target in DeviceKind:
        write = ub_point(UbOp.WRITE, target)
        assert ub_point(UbOp.ATOMIC, target) == write == ub_point(UbOp.SEND, target)
    assert ub_point(UbOp.READ, DeviceKind.CPU) == ub_point(UbOp.READ, DeviceKind.MEMPOOL)


def test_writes_cost_link_capacity_not_just_a_ceiling(mini: LinkGraph) -> None:
    """Two writes into one die share the 137 GB/s of payload one write achieves: a write's byte
    occupies 167/137 bytes of every trunk it crosses. Reads beside them share the rest."""
    target = mini.endpoint("n00-npu5.d0")
    live = LiveFlows(res_cap=mini.trunk_cap())
    for issuer in ("n00-npu1.d0", "n00-npu2.d0"):
        route = mini.route(mini.endpoint(issuer), target)
        write = priced(route, UbOp.WRITE, DeviceKind.NPU, mini.profile)
        assert write.cap == pytest.approx(route.cap * 137 / 167)
        live.add(0.0, write.resources, write.cap, float(BIG))
    rates = [f.rate for f in live.flows.values()]
    assert sum(rates) == pytest.approx(137 * GB) and rates[0] == pytest.approx(rates[1])
    assert ub_wire_cost(UbOp.WRITE) == pytest.approx(167 / 137)
    same = mini.route(mini.endpoint("n00-npu1.d0"), target)
    assert (
        priced(same, UbOp.READ, DeviceKind.NPU, mini.profile) is same
    )  # the reference is unchanged


def test_the_fabric_collective_reproduces_both_moe_points(cm384: LinkGraph) -> None:
    """EP8 (4 NPUs of one node) and EP256 (128 NPUs, 16 nodes): dispatch 116 and 152 us,
    combine 118 and 149 us, whole operation."""
    seen = {}
    for op, ranks, measured in moe_points():
        spec = CollectiveSpec(op=f"moe-{op}", tokens_per_rank=128)
        timing = run_collective(cm384, moe_ranks(cm384, ranks), spec)
        assert timing.flows == ranks * (ranks - 1)
        assert timing.duration_s == pytest.approx(measured, rel=0.02)
        assert timing.duration_s == pytest.approx(measured, abs=0.02e-6)  # in fact to 20 ns
        seen[(op, ranks)] = timing
    for op in ("dispatch", "combine"):  # what grows with the peers: software and transfer
        small, large = seen[(op, 8)], seen[(op, 256)]
        assert large.overhead_s > small.overhead_s and large.transfer_s > small.transfer_s


def test_the_profiles_fit_is_what_the_fabric_gives(cm384: LinkGraph) -> None:
    moe = DEFAULT_PROFILE.moe
    fit = fit_moe_overhead(cm384)
    for op, base, per_peer in (
        ("dispatch", moe.dispatch_overhead_base_s, moe.dispatch_overhead_per_peer_s),
        ("combine", moe.combine_overhead_base_s, moe.combine_overhead_per_peer_s),
    ):
        assert fit[op][0] == pytest.approx(base, abs=10e-9)
        assert fit[op][1] == pytest.approx(per_peer, abs=0.01e-9)
        assert per_peer > 0 and base > 0


def test_the_overhead_grows_linearly_with_the_peers() -> None:
    for op in ("dispatch", "combine"):
        at = {n: moe_overhead_s(op, ranks=n) for n in (2, 8, 32, 256, 320)}
        assert list(at.values()) == sorted(at.values())
        assert moe_overhead_s(op) == at[8]  # default: the EP8 calibration's group
        assert at[320] - at[256] == pytest.approx((at[256] - at[8]) * 64 / 248)


def test_an_ep_group_larger_than_the_topology_is_out_of_range(mini: LinkGraph) -> None:
    with pytest.raises(OutOfRangeError):
        moe_ranks(mini, 256)
