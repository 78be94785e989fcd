"""The fabric service over real gRPC: calibration, contention, faults, statistics, bad input."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cmemu.v1 import device_pb2, fabric_pb2, ub_pb2
from emulator.model.hardware import DEFAULT_PROFILE
from emulator.model.naming import directed_link_id, parse_link
from emulator.runtime.supernode import Supernode
from emulator.testing import Clients

GB = 1e9
DIE_GB_S = DEFAULT_PROFILE.ub.achieved_bytes_per_s_per_die / GB


async def _status(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code().name


@pytest.mark.parametrize(
    ("op", "measured_us"),
    [(fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH, 116.0), (fabric_pb2.COLLECTIVE_OP_MOE_COMBINE, 118.0)],
)
async def test_ep8_moe_dispatch_and_combine_match_the_calibration(
    clients: Clients, op: fabric_pb2.CollectiveOp.ValueType, measured_us: float
) -> None:
    request = fabric_pb2.CollectiveRequest(
        op=op, ranks=[f"n00-npu{i}" for i in range(4)], tokens_per_rank=128, top_k=8
    )
    result = await clients.fabric().Collective(request)
    assert result.ranks == 8 and result.flows == 8 * 7
    assert result.duration_ns / 1e3 == pytest.approx(measured_us, rel=0.01)
    assert result.complete_ns - result.issue_ns == result.duration_ns


async def test_sixteen_flows_into_one_die_each_get_a_sixteenth(clients: Clients) -> None:
    dies = [f"n0{n}-npu{i}.d{d}" for n in range(2) for i in range(8) for d in range(2)]
    target = dies.index("n00-npu0.d0")
    senders = [i for i, name in enumerate(dies) if not name.startswith("n00-npu0.")][:16]
    n = len(dies)
    pairs = [
        (64 << 20) if (i in senders and j == target) else 0 for i in range(n) for j in range(n)
    ]
    result = await clients.fabric().Collective(
        fabric_pb2.CollectiveRequest(
            op=fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL, ranks=dies, pair_bytes=pairs, flow_detail=True
        )
    )
    assert len(result.flow_timings) == 16
    for flow in result.flow_timings:
        assert flow.dst == "n00-npu0.d0"
        assert flow.gb_s == pytest.approx(DIE_GB_S / 16, rel=0.02)


async def test_one_flow_through_the_live_fabric_matches_the_model(clients: Clients) -> None:
    dst = clients.topology.device("n01-npu3")
    region = await clients.device(dst.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=1 << 30)
    )
    route = await clients.fabric().Route(
        fabric_pb2.RouteRequest(src="n00-npu2.d1", dst="n01-npu3.d0")
    )
    done = await clients.bus("n00-npu2").Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE,
            dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
            size=1 << 30,
            size_only=True,
            src_die=1,
        )
    )
    model_ns = route.latency_ns + (1 << 30) / (route.max_gb_s * GB) * 1e9
    assert done.complete_ns - done.issue_ns == pytest.approx(model_ns, rel=0.01)
    assert done.path[0] == "n00-npu2.d1" and done.planes == 7


async def test_intra_node_latency_is_below_inter_node(clients: Clients) -> None:
    fabric = clients.fabric()
    intra = await fabric.Route(fabric_pb2.RouteRequest(src="n00-npu0.d0", dst="n00-npu7.d0"))
    inter = await fabric.Route(fabric_pb2.RouteRequest(src="n00-npu0.d0", dst="n01-npu7.d0"))
    assert intra.latency_ns == pytest.approx(1200 - 512 / DIE_GB_S, abs=1)
    assert 0 < inter.latency_ns - intra.latency_ns < 1000
    assert len(intra.path) == 3 and len(inter.path) == 5


async def test_faults_reroute_and_clear(clients: Clients) -> None:
    fabric = clients.fabric()
    route = await fabric.Route(fabric_pb2.RouteRequest(src="n00-npu1.d0", dst="n01-npu1.d0"))
    l2 = route.path[2]
    fault = await fabric.InjectFault(fabric_pb2.FabricFault(kind="switch-down", target=l2))
    assert fault.id and fault.kind == "switch-down"
    moved = await fabric.Route(fabric_pb2.RouteRequest(src="n00-npu1.d0", dst="n01-npu1.d0"))
    assert moved.path[2] != l2 and moved.planes == 7
    l1 = await fabric.InjectFault(fabric_pb2.FabricFault(kind="switch-down", target="n01-l1s0"))
    six = await fabric.Route(fabric_pb2.RouteRequest(src="n00-npu1.d0", dst="n01-npu1.d0"))
    assert six.planes == 6 and six.max_gb_s == pytest.approx(route.max_gb_s * 6 / 7)
    listed = await fabric.ListFaults(fabric_pb2.ListFaultsRequest())
    assert [f.id for f in listed.faults] == [fault.id, l1.id]
    left = await fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=fault.id))
    assert [f.id for f in left.faults] == [l1.id]
    assert not (await fabric.ClearFault(fabric_pb2.ClearFaultRequest(all=True))).faults
    assert (
        await fabric.Route(fabric_pb2.RouteRequest(src="n00-npu1.d0", dst="n01-npu1.d0"))
    ) == route


async def test_partition_makes_transfers_unavailable(clients: Clients) -> None:
    fabric = clients.fabric()
    pool = clients.topology.device("n01-mem")
    region = await clients.device(pool.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=4096)
    )
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE, dst=ub_pb2.UbAddress(eid=pool.eid, offset=region.offset), data=b"x"
    )
    cut = await fabric.InjectFault(
        fabric_pb2.FabricFault(kind="partition", side_a=["n00-npu4"], side_b=["n01-mem"])
    )
    try:
        assert await _status(clients.bus("n00-npu4").Submit(write)) == "UNAVAILABLE"
        await clients.bus("n00-npu5").Submit(write)  # the rest still reach it
        collective = fabric_pb2.CollectiveRequest(
            op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=["n00-npu4", "n00-npu5"], bytes=10
        )
        await fabric.Collective(collective)  # not across the cut
    finally:
        await fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=cut.id))
    await clients.bus("n00-npu4").Submit(write)


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (fabric_pb2.CollectiveRequest(ranks=["n00-npu0", "n00-npu1"], bytes=8), "INVALID_ARGUMENT"),
        (
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=["n00-npu0", "n00-npu0"], bytes=8
            ),
            "INVALID_ARGUMENT",
        ),
        (
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=["n00-npu0", "n00-npu1"]
            ),
            "INVALID_ARGUMENT",
        ),
        (
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL, ranks=["n00-npu0"], pair_bytes=[1, 2, 3]
            ),
            "INVALID_ARGUMENT",
        ),
        (
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_BROADCAST, ranks=["n00-npu0"], bytes=8, root=2
            ),
            "OUT_OF_RANGE",
        ),
        (
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, ranks=["n00-npu0", "n00-mem"], bytes=8
            ),
            "INVALID_ARGUMENT",
        ),
        (
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, ranks=["n00-npu0", "n05-npu0"], bytes=8
            ),
            "NOT_FOUND",
        ),
        (
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH, ranks=["n00-npu0"]
            ),
            "INVALID_ARGUMENT",
        ),
    ],
)
async def test_bad_collectives(
    clients: Clients, request_: fabric_pb2.CollectiveRequest, code: str
) -> None:
    assert await _status(clients.fabric().Collective(request_)) == code
    assert await clients.health("n00-npu0") == "SERVING"


async def test_bad_fabric_requests_and_the_fabric_keeps_serving(
    mini: Supernode, clients: Clients
) -> None:
    fabric = clients.fabric()
    bad = [
        (fabric.Route(fabric_pb2.RouteRequest(src="n00-npu0", dst="n42-npu0")), "NOT_FOUND"),
        (fabric.Route(fabric_pb2.RouteRequest(src="n00-npu0.d7", dst="n00-npu1")), "OUT_OF_RANGE"),
        (fabric.InjectFault(fabric_pb2.FabricFault(kind="gremlins")), "INVALID_ARGUMENT"),
        (fabric.InjectFault(fabric_pb2.FabricFault(kind="link-down", target="a~b")), "NOT_FOUND"),
        (
            fabric.InjectFault(
                fabric_pb2.FabricFault(
                    kind="link-degraded", target="n00-npu0.d0~n00-l1s0", factor=0
                )
            ),
            "INVALID_ARGUMENT",
        ),
        (fabric.ClearFault(fabric_pb2.ClearFaultRequest(id="f999")), "NOT_FOUND"),
        (  # a transfer must come from a device
            fabric.Transfer(
                ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=16), size=8)
            ),
            "INVALID_ARGUMENT",
        ),
        (
            clients.bus("n00-npu0").Submit(
                ub_pb2.UbTransaction(
                    op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=17), size=8, src_die=2
                )
            ),
            "OUT_OF_RANGE",
        ),
        (
            clients.bus("n00-cpu0").Submit(
                ub_pb2.UbTransaction(
                    op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=17), size=8, src_die=1
                )
            ),
            "INVALID_ARGUMENT",
        ),
    ]
    for call, code in bad:
        assert await _status(call) == code
    address = mini.topology.services[0].address
    assert address and await clients.health("n00-npu0") == "SERVING"
    assert not (await fabric.ListFaults(fabric_pb2.ListFaultsRequest())).faults


async def test_link_statistics_and_their_stream(clients: Clients) -> None:
    """Its own traffic first: the test must not depend on what earlier tests moved."""
    dst = clients.topology.device("n01-npu1")
    region = await clients.device(dst.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=1 << 20)
    )
    await clients.bus("n00-npu1").Submit(
        ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_WRITE,
            dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
            size=1 << 20,
            size_only=True,
        )
    )
    await clients.device(dst.id).FreeRegion(
        device_pb2.FreeRegionRequest(region_id=region.region_id)
    )
    fabric = clients.fabric()
    stats = await fabric.GetLinkStats(fabric_pb2.LinkStatsRequest(top=5))
    assert len(stats.links) == 5 and stats.completed_flows > 0
    assert stats.links[0].bytes >= stats.links[-1].bytes > 0
    assert all(">" in s.link and s.capacity_gb_s > 0 for s in stats.links)
    stream = fabric.WatchLinkStats(fabric_pb2.WatchLinkStatsRequest(top=3, interval_ms=20))
    seen = []
    async for update in stream:
        seen.append(update)
        if len(seen) == 3:
            break
    stream.cancel()
    assert [len(s.links) for s in seen] == [3, 3, 3]
    assert seen[0].emulated_ns < seen[-1].emulated_ns
    bad = fabric.WatchLinkStats(fabric_pb2.WatchLinkStatsRequest(interval_ms=1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in bad:
            pass
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_concurrent_transfers_share_the_target_die(clients: Clients) -> None:
    """Live contention: 4 writes of 32 GiB (0.2 s emulated each) into one die at once take longer
    than one alone: they overlap in emulated time however slowly their requests arrive."""
    dst = clients.topology.device("n01-npu6")
    region = await clients.device(dst.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=32 << 30)
    )
    write = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE,
        dst=ub_pb2.UbAddress(eid=dst.eid, offset=region.offset),
        size=32 << 30,
        size_only=True,
    )
    alone = await clients.bus("n00-npu0").Submit(write)
    together = await asyncio.gather(
        *(clients.bus(f"n00-npu{i}").Submit(write) for i in range(1, 5))
    )
    single = alone.complete_ns - alone.issue_ns
    slowest = max(t.complete_ns - t.issue_ns for t in together)
    assert slowest > 1.5 * single  # they overlapped in emulated time and shared the die's ports


async def test_a_link_name_from_the_statistics_pastes_into_a_link_fault(clients: Clients) -> None:
    """`cmemu links` prints the names GetLinkStats gives (directed links, a>b); each is a fault
    target exactly as printed, and takes its physical link down: both directions."""
    fabric = clients.fabric()
    stats = await fabric.GetLinkStats(fabric_pb2.LinkStatsRequest(top=3))
    name = stats.links[0].link
    fault = await fabric.InjectFault(fabric_pb2.FabricFault(kind="link-down", target=name))
    try:
        assert fault.target == name
        after = await fabric.GetLinkStats(fabric_pb2.LinkStatsRequest(top=100_000))
        link = parse_link(name)
        assert {s.link for s in after.links if not s.up} == {
            name,
            directed_link_id(link.b, link.a),
        }
    finally:
        await fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=fault.id))
    again = await fabric.GetLinkStats(fabric_pb2.LinkStatsRequest(top=100_000))
    assert all(s.up for s in again.links)
