"""The faults real supernodes have (issue 20, item 5), each through real gRPC against one
in-process cm-mini: a throttled node computes slower, a lossy link moves bytes slower, an
intermittently hung device answers only between its hangs, an optical module takes its bundle
of uplinks away. Every effect is measured on the data path, its clear restores it, and bad
parameters are refused. Each test clears what it injected."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client import faults
from cmemu.emulator.client.clock import held_time
from cmemu.emulator.model.costmodel import UbOp, ub_latency_s
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, fabric_pb2, faultparams_pb2, ub_pb2
from tests.services.test_faultkinds import KERNEL, _refused, _until

GB = 1e9


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    """cm-mini at ten emulated seconds per wall second: the hang windows pass quickly."""
    async with running_supernode("cm-mini", time_scale=10.0) as supernode:
        yield supernode


async def _rank_faults(clients: Clients, kind: str) -> list[fabric_pb2.FabricFault]:
    listed = await clients.fabric().ListFaults(fabric_pb2.ListFaultsRequest())
    return [f for f in listed.faults if f.kind == kind]


# --- thermal-throttle ----------------------------------------------------------------------------


async def test_a_throttled_node_computes_slower_as_one_fault(clients: Clients) -> None:
    npus = [d.id for d in clients.topology.devices if d.node == "n01" and d.kind.value == "npu"]
    fault = await faults.inject(clients, "thermal-throttle", "n01", {"compute": "0.5"})
    assert fault.id == "node:n01:thermal-throttle" and f"on {len(npus)} NPUs" in fault.detail
    for npu in npus:  # every NPU of the node: a compute step takes twice as long
        assert (await clients.npu(npu).SubmitKernel(KERNEL)).duration_ns == 2_000_000
    assert (await clients.npu("n00-npu1").SubmitKernel(KERNEL)).duration_ns == 1_000_000
    telemetry = await clients.device(npus[3]).GetTelemetry(device_pb2.GetTelemetryRequest())
    assert telemetry.compute_share == 0.5 and "thermal-throttle" in telemetry.faults
    ranks = await _rank_faults(clients, "rank-slow")  # the collectives wait for the slow ranks
    assert sorted(f.target for f in ranks) == sorted(npus) and {
        f.rank_slow.factor for f in ranks
    } == {0.5}
    listed = {f.id: f for f in await faults.list_all(clients)}
    assert fault.id in listed and not any(i.startswith("dev:n01-") for i in listed)
    # a slow fault on a throttled NPU compounds with it
    slow = await faults.inject(clients, "slow", npus[0], {"compute": "0.5"})
    assert (await clients.npu(npus[0]).SubmitKernel(KERNEL)).duration_ns == 4_000_000
    await faults.clear(clients, slow.id)
    assert (await clients.npu(npus[0]).SubmitKernel(KERNEL)).duration_ns == 2_000_000
    await faults.clear(clients, fault.id)  # one id clears every NPU
    for npu in npus:
        assert (await clients.npu(npu).SubmitKernel(KERNEL)).duration_ns == 1_000_000
    assert not await _rank_faults(clients, "rank-slow")
    with pytest.raises(NotFoundError):
        await faults.clear(clients, fault.id)


async def test_a_throttle_is_all_or_nothing_and_checks_its_params(clients: Clients) -> None:
    held = await clients.device("n01-npu5").InjectFault(
        device_pb2.FaultState(
            kind="thermal-throttle",
            thermal_throttle=faultparams_pb2.ThermalThrottleParams(compute=0.9),
        )
    )
    busy = await _refused(faults.inject(clients, "thermal-throttle", "n01"))
    assert (busy.code, busy.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "FAULT_ALREADY_ACTIVE")
    others = [f.target for f in await faults.device_faults(clients)]
    assert others == ["n01"]  # only n01-npu5's own, listed under its node; the rest undone
    assert (await clients.npu("n01-npu0").SubmitKernel(KERNEL)).duration_ns == 1_000_000
    await faults.clear(clients, f"dev:{held.device}:thermal-throttle")
    with pytest.raises(InvalidArgumentError, match=r"compute must be in \(0, 1\)"):
        await faults.inject(clients, "thermal-throttle", "n01", {"compute": "1"})
    with pytest.raises(NotFoundError, match="no node 'n99'"):
        await faults.inject(clients, "thermal-throttle", "n99")
    cpu = await _refused(
        clients.device("n01-cpu0").InjectFault(device_pb2.FaultState(kind="thermal-throttle"))
    )
    assert (cpu.code, cpu.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "WRONG_DEVICE_KIND")


# --- link-loss -----------------------------------------------------------------------------------


async def _write(clients: Clients, src: str, dst: str, size: int) -> ub_pb2.UbCompletion:
    """A bulk write from die 1 of `src` into `dst`'s HBM, timed by the fabric."""
    target = clients.topology.device(dst)
    region = await clients.device(dst).AllocateRegion(device_pb2.AllocateRegionRequest(size=size))
    try:
        return await clients.bus(src).Submit(
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_WRITE,
                dst=ub_pb2.UbAddress(eid=target.eid, offset=region.offset),
                size=size,
                size_only=True,
                src_die=1,
            )
        )
    finally:
        await clients.device(dst).FreeRegion(
            device_pb2.FreeRegionRequest(region_id=region.region_id)
        )


def _bandwidth_ns(done: ub_pb2.UbCompletion, route: fabric_pb2.RouteInfo) -> float:
    """A write's time less its route's latency (a write's own): what the bytes took."""
    extra_ns = (ub_latency_s(UbOp.WRITE) - ub_latency_s(UbOp.READ)) * 1e9
    return done.complete_ns - done.issue_ns - route.latency_ns - extra_ns


async def test_a_lossy_link_moves_bytes_slower_by_its_goodput(clients: Clients) -> None:
    src, dst, size = "n00-npu2", "n00-npu3", 1 << 30
    fabric = clients.fabric()
    ask = fabric_pb2.RouteRequest(src=f"{src}.d1", dst=f"{dst}.d0")
    clean_route = await fabric.Route(ask)
    clean = await _write(clients, src, dst, size)
    rate = 0.2  # one of the die's 7 ports (planes) loses a fifth of its frames
    fault = await faults.inject(clients, "link-loss", f"{src}.d1~n00-l1s3", {"rate": str(rate)})
    assert f"rate={rate:g}" in fault.detail
    lossy_route = await fabric.Route(ask)
    planes = clean_route.planes
    assert lossy_route.max_gb_s == pytest.approx(clean_route.max_gb_s * (planes - rate) / planes)
    lossy = await _write(clients, src, dst, size)
    slower = _bandwidth_ns(lossy, lossy_route) / _bandwidth_ns(clean, clean_route)
    assert slower == pytest.approx(planes / (planes - rate), rel=1e-4)  # goodput (1 - p)
    # each crossing waits p/(1-p) replay round trips; data is sprayed, so the route waits too
    replay_ns = DEFAULT_PROFILE.switch.link_retry_s * 1e9 * rate / (1 - rate)
    assert lossy_route.latency_ns == pytest.approx(clean_route.latency_ns + replay_ns, abs=1)
    other = fabric_pb2.RouteRequest(src="n00-npu4.d1", dst="n00-npu5.d0")
    assert (await fabric.Route(other)).max_gb_s == pytest.approx(clean_route.max_gb_s)
    await faults.clear(clients, fault.id)
    assert (await fabric.Route(ask)).max_gb_s == pytest.approx(clean_route.max_gb_s)
    again = await _write(clients, src, dst, size)
    took = clean.complete_ns - clean.issue_ns
    assert again.complete_ns - again.issue_ns == pytest.approx(took, abs=2)


async def test_link_loss_refuses_bad_rates_and_unknown_links(clients: Clients) -> None:
    link = "n00-npu2.d1~n00-l1s3"
    for rate in ("0", "1", "-0.1", "lots"):
        with pytest.raises(InvalidArgumentError, match="rate"):
            await faults.inject(clients, "link-loss", link, {"rate": rate})
    with pytest.raises(InvalidArgumentError, match="rate is required"):
        await faults.inject(clients, "link-loss", link)
    raw = await _refused(
        clients.fabric().InjectFault(fabric_pb2.FabricFault(kind="link-loss", target=link))
    )
    assert (raw.code, raw.metadata.get("field")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "params.rate",
    )
    missing = await _refused(
        faults.inject(clients, "link-loss", "n00-npu2.d1~n07-l1s3", {"rate": 0.1})
    )
    assert missing.code is grpc.StatusCode.NOT_FOUND


# --- intermittent-hang ---------------------------------------------------------------------------


def _health(clients: Clients, device: str) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(clients.channel(device))


async def test_an_intermittent_hang_answers_only_between_its_hangs(
    mini: Supernode, clients: Clients
) -> None:
    device, period_s, hang_s = "n00-npu6", 30.0, 10.0
    params = {"period_s": str(period_s), "hang_s": str(hang_s)}
    health = _health(clients, device)
    async with held_time(mini.topology, name="intermittent-hang test") as held:
        assert held  # emulated time all but stands still: the first hang lasts in wall time
        fault = await faults.inject(clients, "intermittent-hang", device, params)
        late = await _refused(health.Check(health_pb2.HealthCheckRequest(), timeout=0.5))
        assert late.code is grpc.StatusCode.DEADLINE_EXCEEDED  # hung: no answer, health too
        assert [f.target for f in await _rank_faults(clients, "rank-hung")] == [device]
    # time runs again: a call waits out the hang and is answered between two hangs
    answered = await clients.device(device).GetTelemetry(
        device_pb2.GetTelemetryRequest(), timeout=120
    )
    phase_s = ((answered.emulated_ns - fault.since_ns) / 1e9) % period_s
    assert phase_s >= hang_s - 1e-6, phase_s
    assert fault.id in {f.id for f in await faults.list_all(clients)}  # it recovered by itself

    async def hung_again() -> bool:  # the next period hangs again, by itself
        return bool(await _rank_faults(clients, "rank-hung"))

    async def answering() -> bool:
        return not await _rank_faults(clients, "rank-hung")

    await _until(answering)
    await _until(hung_again)
    await faults.clear(clients, fault.id)
    ok = await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert ok.status == health_pb2.HealthCheckResponse.SERVING
    assert not await _rank_faults(clients, "rank-hung")
    assert fault.id not in {f.id for f in await faults.list_all(clients)}


async def test_an_intermittent_hang_checks_its_windows(clients: Clients) -> None:
    bad: list[dict[str, str]] = [
        {"hang_s": "30", "period_s": "30"},  # a hang, not an intermittent one
        {"hang_s": "0"},
        {"hang_s": "0.001"},  # shorter than limits.fault_window_min_s: no caller would see it
        {"hang_s": "1", "period_s": "1.001"},  # nor such a gap
        {"period_s": "x"},
    ]
    for params in bad:
        with pytest.raises(InvalidArgumentError):
            await faults.inject(clients, "intermittent-hang", "n00-npu6", params)
    raw = await _refused(
        clients.device("n00-npu6").InjectFault(
            device_pb2.FaultState(
                kind="intermittent-hang",
                intermittent_hang=faultparams_pb2.IntermittentHangParams(hang_s=50, period_s=10),
            )
        )
    )
    assert (raw.code, raw.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FAULT_PARAM")


# --- optical-module ------------------------------------------------------------------------------


async def _all_to_all_ns(clients: Clients) -> int:
    """Every die of n00 sends 16 MiB to every die of n01: the node's uplinks carry it all."""
    dies = [f"n0{n}-npu{i}.d{d}" for n in range(2) for i in range(8) for d in range(2)]
    pairs = [(16 << 20) if i < 16 <= j else 0 for i in range(32) for j in range(32)]
    result = await clients.fabric().Collective(
        fabric_pb2.CollectiveRequest(
            op=fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL, ranks=dies, pair_bytes=pairs
        )
    )
    return result.duration_ns


async def test_an_optical_module_takes_its_bundle_of_uplinks_as_one_fault(
    clients: Clients,
) -> None:
    fabric = clients.fabric()
    across = fabric_pb2.RouteRequest(src="n00-npu0.d0", dst="n01-npu0.d0")
    inside = fabric_pb2.RouteRequest(src="n01-npu0.d0", dst="n01-npu1.d0")
    clean_ns = await _all_to_all_ns(clients)
    first = await faults.inject(clients, "optical-module", "n01-l1s2", {"module": "0"})
    assert "module=0" in first.detail
    slowed_ns = await _all_to_all_ns(clients)
    assert slowed_ns > clean_ns  # half of plane 2's uplinks of n01 are gone
    assert (await fabric.Route(across)).planes == 7  # the other module still carries plane 2
    second = await faults.inject(clients, "optical-module", "n01-l1s2", {"module": "1"})
    cut = await fabric.Route(across)
    assert cut.planes == 6 and "n01-l1s2" not in cut.path
    assert (await fabric.Route(inside)).planes == 7  # the chip still switches inside the node
    await faults.clear(clients, second.id)
    await faults.clear(clients, first.id)
    assert (await fabric.Route(across)).planes == 7
    assert await _all_to_all_ns(clients) == clean_ns


async def test_an_l1_board_cuts_its_node_off_the_bus_and_nothing_else(clients: Clients) -> None:
    fabric = clients.fabric()
    across = fabric_pb2.RouteRequest(src="n00-npu0.d0", dst="n01-npu0.d0")
    inside = fabric_pb2.RouteRequest(src="n01-npu0.d0", dst="n01-npu1.d0")
    other = fabric_pb2.RouteRequest(src="n00-npu0.d0", dst="n00-npu1.d0")
    clean = await fabric.Route(other)
    board = await faults.inject(clients, "l1-board", "n01")
    try:
        for cut in (across, inside):  # inside the node too: its traffic crosses the L1 chips
            refused = await _refused(fabric.Route(cut))
            assert (refused.code, refused.reason) == (grpc.StatusCode.UNAVAILABLE, "ROUTE_CUT")
        # the twin: the other node's traffic takes its own paths, untouched
        assert (await fabric.Route(other)).path == clean.path
        # the node's devices are up: cut off the bus, not dead
        info = await clients.device("n01-npu0").GetInfo(device_pb2.GetInfoRequest())
        assert info.id == "n01-npu0"
        listed = {f.id: f for f in await faults.list_all(clients)}
        assert listed[board.id].kind == "l1-board" and listed[board.id].target == "n01"
    finally:
        await faults.clear(clients, board.id)
    assert (await fabric.Route(across)).planes == 7
    assert (await fabric.Route(inside)).planes == 7


async def test_an_l1_board_is_a_nodes(clients: Clients) -> None:
    chip = await _refused(faults.inject(clients, "l1-board", "n01-l1s2"))
    assert (chip.code, chip.metadata.get("field")) == (grpc.StatusCode.INVALID_ARGUMENT, "target")
    gone = await _refused(faults.inject(clients, "l1-board", "n09"))
    assert (gone.code, gone.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")


async def test_an_optical_module_is_an_l1_chips(clients: Clients) -> None:
    past = await _refused(faults.inject(clients, "optical-module", "n01-l1s2", {"module": 2}))
    assert (past.code, past.metadata.get("field")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "params.module",
    )
    l2 = await _refused(faults.inject(clients, "optical-module", "l2-p0-s0"))
    assert (l2.code, l2.metadata.get("field")) == (grpc.StatusCode.INVALID_ARGUMENT, "target")
    gone = await _refused(faults.inject(clients, "optical-module", "n09-l1s0"))
    assert gone.code is grpc.StatusCode.NOT_FOUND
    with pytest.raises(InvalidArgumentError, match="module must be >= 0"):
        await faults.inject(clients, "optical-module", "n01-l1s2", {"module": -1})
