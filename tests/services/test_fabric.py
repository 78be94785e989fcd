"""The fabric service over real gRPC: calibration, contention, faults, statistics, bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import grpc
import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.errors import decode
from cmemu.emulator.model.costmodel import UbOp, ub_latency_s, ub_transfer_ns, ub_wire_cost
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.naming import directed_link_id, parse_link
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, fabric_pb2, faultparams_pb2, ub_pb2

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
    # Route gives the reference (read) route; a write takes its own latency and cost per byte
    extra_ns = (ub_latency_s(UbOp.WRITE) - ub_latency_s(UbOp.READ)) * 1e9
    cost = ub_wire_cost(UbOp.WRITE)
    model_ns = route.latency_ns + extra_ns + (1 << 30) * cost / (route.max_gb_s * GB) * 1e9
    assert done.complete_ns - done.issue_ns == pytest.approx(model_ns, rel=1e-6)
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
        fabric_pb2.FabricFault(
            kind="partition",
            partition=faultparams_pb2.PartitionParams(side_a="n00-npu4", side_b="n01-mem"),
        )
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


async def _refusal(call: object) -> str:
    """`CODE REASON` of a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    error = decode(err.value)
    return f"{error.code.name} {error.reason}"


async def test_a_one_way_partition_loses_one_direction_only(clients: Clients) -> None:
    """side_a's frames to side_b are lost, side_b's to side_a are not: a's writes and reads of b
    fail and change nothing; b's write to a lands but is never acknowledged (its issuer is told
    ACK_LOST, a third device reads the bytes there); b's read of a fails (its data would cross
    the cut); a collective of both fails. The twin: cleared, everything goes through."""
    a, b, witness = "n00-npu4", "n00-npu6", "n00-npu5"
    regions = {}
    for device in (a, b):
        region = await clients.device(device).AllocateRegion(
            device_pb2.AllocateRegionRequest(size=4096)
        )
        regions[device] = ub_pb2.UbAddress(eid=clients.topology.device(device).eid,
                                           offset=region.offset)  # fmt: skip

    def write(to: str, data: bytes) -> ub_pb2.UbTransaction:
        return ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=regions[to], data=data)

    def read(of: str) -> ub_pb2.UbTransaction:
        return ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=regions[of], size=2)

    async def seen(device: str) -> bytes:
        return (await clients.bus(witness).Submit(read(device))).data

    cut = await faults.inject(
        clients, "partition", "", {"side_a": a, "side_b": b, "one_way": "true"}
    )
    listed = {f.id: f for f in await faults.list_all(clients)}
    assert "one-way" in listed[cut.id].detail
    try:
        assert await _refusal(clients.bus(a).Submit(write(b, b"aa"))) == "UNAVAILABLE ROUTE_CUT"
        assert await seen(b) == b"\0\0"  # never arrived
        assert await _refusal(clients.bus(a).Submit(read(b))) == "UNAVAILABLE ROUTE_CUT"
        assert await _refusal(clients.bus(b).Submit(write(a, b"bb"))) == "UNAVAILABLE ACK_LOST"
        assert await seen(a) == b"bb"  # landed, unacknowledged
        assert (await _refusal(clients.bus(b).Submit(read(a)))).startswith("UNAVAILABLE")
        gather = fabric_pb2.CollectiveRequest(
            op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=[a, b], bytes=10
        )
        assert (await _refusal(clients.fabric().Collective(gather))).startswith("UNAVAILABLE")
    finally:
        await faults.clear(clients, cut.id)
    await clients.bus(a).Submit(write(b, b"aa"))
    await clients.bus(b).Submit(write(a, b"cc"))
    assert (await clients.bus(b).Submit(read(a))).data == b"cc"
    assert await seen(b) == b"aa"


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
                    kind="link-degraded",
                    target="n00-npu0.d0~n00-l1s0",
                    link_degraded=faultparams_pb2.LinkDegradedParams(factor=0),
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


# --- the published UB rows and MoE points through the live fabric ------------------------------

BIG = 1 << 30
UB_ROWS = [  # (op, target device, published GB/s, published ns for 512 bytes): one die, one node
    (ub_pb2.UB_OP_READ, "n00-npu1", 167, 1200),
    (ub_pb2.UB_OP_WRITE, "n00-npu1", 137, 1300),
    (ub_pb2.UB_OP_READ, "n00-mem", 151, 1000),
    (ub_pb2.UB_OP_WRITE, "n00-mem", 110, 1100),
]


def _tx(op: ub_pb2.UbOp.ValueType, dst: ub_pb2.UbAddress, size: int) -> ub_pb2.UbTransaction:
    if size > 4096:
        return ub_pb2.UbTransaction(op=op, dst=dst, size=size, size_only=True)
    if op == ub_pb2.UB_OP_READ:
        return ub_pb2.UbTransaction(op=op, dst=dst, size=size)
    return ub_pb2.UbTransaction(op=op, dst=dst, data=bytes(range(256)) * (size // 256))


@pytest.mark.parametrize(("op", "target", "gb_s", "small_ns"), UB_ROWS)
async def test_each_published_ub_row_through_submit(
    clients: Clients, op: ub_pb2.UbOp.ValueType, target: str, gb_s: float, small_ns: int
) -> None:
    """One transfer at a time from n00-npu0's die 0, over real gRPC: 512 bytes take the
    published time and a bulk transfer moves at the published bandwidth."""
    device = clients.topology.device(target)
    region = await clients.device(target).AllocateRegion(device_pb2.AllocateRegionRequest(size=BIG))
    dst = ub_pb2.UbAddress(eid=device.eid, offset=region.offset)
    try:
        bus = clients.bus("n00-npu0")
        small = await bus.Submit(_tx(op, dst, 512))
        big = await bus.Submit(_tx(op, dst, BIG))
    finally:
        await clients.device(target).FreeRegion(
            device_pb2.FreeRegionRequest(region_id=region.region_id)
        )
    small_took = small.complete_ns - small.issue_ns
    big_took = big.complete_ns - big.issue_ns
    assert small_took == pytest.approx(small_ns, abs=1)
    assert (BIG - 512) / ((big_took - small_took) / 1e9) == pytest.approx(gb_s * GB, rel=1e-5)
    assert "n00-npu0.d0" in small.path and len(small.path) == 3  # through one L1 chip


async def test_atomics_sends_and_a_cpus_memory_are_timed_by_their_own_figures(
    clients: Clients,
) -> None:
    """Atomics and SENDs are priced as writes; a CPU's own DRAM is CPU memory (its UB ports
    bound the bandwidth). The live fabric agrees with the closed-form cost model."""
    pool, cpu = clients.topology.device("n00-mem"), clients.topology.device("n00-cpu1")
    region = await clients.device(pool.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=4096)
    )
    cpu_region = await clients.device(cpu.id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=1 << 20)
    )
    bus = clients.bus("n00-npu0")
    word = ub_pb2.UbAddress(eid=pool.eid, offset=region.offset)
    cpu_dst = ub_pb2.UbAddress(eid=cpu.eid, offset=cpu_region.offset)
    cases = [
        (ub_pb2.UbTransaction(op=ub_pb2.UB_OP_FETCH_ADD, dst=word, operand=1), UbOp.ATOMIC, pool),
        (
            ub_pb2.UbTransaction(op=ub_pb2.UB_OP_CAS, dst=word, compare=1, operand=2),
            UbOp.ATOMIC,
            pool,
        ),
        (ub_pb2.UbTransaction(op=ub_pb2.UB_OP_SEND, dst=cpu_dst, data=b"m" * 64), UbOp.SEND, cpu),
        (ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=cpu_dst, size=1 << 20), UbOp.READ, cpu),
    ]
    for tx, op, target in cases:
        done = await bus.Submit(tx)
        model = ub_transfer_ns(
            done.size, src=DeviceKind.NPU, dst=target.kind, cross_node=False, op=op
        )
        assert done.complete_ns - done.issue_ns == pytest.approx(model, abs=1), op
    write_ns = ub_transfer_ns(8, src=DeviceKind.NPU, dst=DeviceKind.MEMPOOL, cross_node=False)
    assert model > write_ns  # (the last: a MiB read from one CPU)
    await clients.bus(cpu.id).Receive(ub_pb2.ReceiveRequest(max_messages=10))


@pytest.mark.slow
async def test_the_fabric_collective_reproduces_moe_at_ep8_and_ep256_on_cm384() -> None:
    """Dispatch and combine of 128 tokens per rank, top-8, over real gRPC on cm384: EP8 on 4 NPUs
    of one node and EP256 on 128 NPUs (16 nodes) take the published time within 2%."""
    published = {
        (fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH, 8): 116.0,
        (fabric_pb2.COLLECTIVE_OP_MOE_COMBINE, 8): 118.0,
        (fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH, 256): 152.0,
        (fabric_pb2.COLLECTIVE_OP_MOE_COMBINE, 256): 149.0,
    }
    async with running_supernode("cm384") as supernode:
        clients = Clients(supernode.topology)
        try:
            for (op, dies), us in published.items():
                npus = [f"n{i // 8:02d}-npu{i % 8}" for i in range(dies // 2)]
                result = await clients.fabric().Collective(
                    fabric_pb2.CollectiveRequest(op=op, ranks=npus, tokens_per_rank=128, top_k=8)
                )
                assert result.ranks == dies and result.flows == dies * (dies - 1)
                assert result.duration_ns / 1e3 == pytest.approx(us, rel=0.02)
                assert result.overhead_ns < result.duration_ns
        finally:
            await clients.close()


# --- the collective queue's limit -------------------------------------------------------------


async def test_a_full_collective_queue_is_resource_exhausted_and_retryable() -> None:
    """With every collective worker held (a gate on the fabric's own threads, so that nothing
    finishes meanwhile), workers + queue_max collectives wait and the next is refused with
    RESOURCE_EXHAUSTED, reason COLLECTIVE_QUEUE_FULL and a RetryInfo; once the workers are free,
    every waiting collective completes and new ones are accepted."""
    limits = dataclasses.replace(
        DEFAULT_PROFILE.limits, collective_workers=1, collective_queue_max=2
    )
    profile = dataclasses.replace(DEFAULT_PROFILE, limits=limits)
    bound = limits.collective_workers + limits.collective_queue_max
    request = fabric_pb2.CollectiveRequest(
        op=fabric_pb2.COLLECTIVE_OP_ALL_GATHER, ranks=["n00-npu0", "n01-npu0"], bytes=1 << 20
    )
    gate = threading.Event()
    async with running_supernode("cm-mini", profile=profile) as supernode:
        state = supernode.local.fabric
        assert state is not None
        clients = Clients(supernode.topology)
        try:
            held = [
                state.collectives._pool.submit(gate.wait, 60.0)
                for _ in range(limits.collective_workers)
            ]

            async def collective() -> fabric_pb2.CollectiveResult:
                return await clients.fabric().Collective(request)

            waiting = [asyncio.create_task(collective()) for _ in range(bound)]
            async with asyncio.timeout(30):  # a safety net, not a timing assertion
                while state.collectives.pending < bound:  # noqa: ASYNC110 (no event for it)
                    await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await clients.fabric().Collective(request)
            details = decode(err.value)
            assert details.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details.reason == "COLLECTIVE_QUEUE_FULL" and details.retryable
            assert state.collectives.pending == bound  # the refused one took no place
            gate.set()
            done = await asyncio.gather(*waiting)
            assert [d.ranks for d in done] == [4] * bound
            assert all(h.result() for h in held)
            assert state.collectives.pending == 0
            assert (await clients.fabric().Collective(request)).ranks == 4
        finally:
            gate.set()
            await clients.close()


async def test_a_repeated_collective_is_timed_once_until_a_fault_changes_the_fabric(
    mini: Supernode, clients: Clients
) -> None:
    """A decode loop sends the same dispatch every step: the fabric reuses its timing (it depends
    on the ranks, the request and the faults only) and times it afresh after any fault change."""
    state = mini.local.fabric
    assert state is not None
    request = fabric_pb2.CollectiveRequest(
        op=fabric_pb2.COLLECTIVE_OP_MOE_DISPATCH,
        ranks=[f"n0{n}-npu{i}" for n in range(2) for i in range(4)],
        tokens_per_rank=128,
    )
    fabric = clients.fabric()
    first = await fabric.Collective(request)
    hits = state.collectives.memo_hits
    again = await fabric.Collective(request)
    assert state.collectives.memo_hits == hits + 1
    assert (again.duration_ns, again.flows, again.total_bytes) == (
        first.duration_ns,
        first.flows,
        first.total_bytes,
    )
    assert again.issue_ns > first.issue_ns  # timed from its own issue
    fault = await fabric.InjectFault(
        fabric_pb2.FabricFault(
            kind="link-degraded",
            target="n00-npu0.d0~n00-l1s0",
            link_degraded=faultparams_pb2.LinkDegradedParams(factor=0.1),
        )
    )
    try:
        slower = await fabric.Collective(request)
        assert slower.duration_ns > first.duration_ns and state.collectives.memo_hits == hits + 1
    finally:
        await fabric.ClearFault(fabric_pb2.ClearFaultRequest(id=fault.id))
    back = await fabric.Collective(request)
    assert back.duration_ns == first.duration_ns and state.collectives.memo_hits == hits + 1
