"""clock-skew (issue 20 item 5), through real gRPC against an in-process cm-mini: a skewed
device's stamps are off by the offset, ahead or behind; a duration its clock keeps ends early by
a step ahead; the manager's detection keeps the devices of a skewed process (a node regrouped
as the process procs mode would make it: one host clock for its devices and their liveness
beats) and fails none for the clock's jump; bad parameters and targets are refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.device.liveness import Liveness
from cmemu.emulator.engines.manager.liveness import LivenessWatch
from cmemu.emulator.engines.skewclock import LocalClock
from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.manager.detector import FAILED, SUSPECT, Detector, Incident
from cmemu.emulator.runtime.launchmodes import Procs
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.services.peers import Peers
from cmemu.v1 import device_pb2, fabric_pb2, faultparams_pb2, manager_pb2
from tests.services.test_faultkinds import _refused, _until
from tests.services.test_faultkinds_real import _write

SKEWED, WITNESS = "n00-npu1", "n00-npu2"  # the witness's clock is right: the true time
S = 1_000_000_000


@pytest.fixture(scope="module")
async def mini() -> AsyncIterator[Supernode]:
    """cm-mini at ten emulated seconds per wall second: the durations pass quickly."""
    async with running_supernode("cm-mini", time_scale=10.0) as supernode:
        yield supernode


def _timeline(sn: Supernode) -> Timeline:
    """The emulator's own time (the manager's, the witness's)."""
    assert sn.local.time is not None
    return sn.local.time.timeline


async def _stamp(clients: Clients, device: str) -> int:
    """The emulated time `device`'s process stamps its telemetry with."""
    reply = await clients.device(device).GetTelemetry(device_pb2.GetTelemetryRequest(), timeout=30)
    return int(reply.emulated_ns)


@pytest.mark.parametrize("offset_s", [30.0, -30.0])
async def test_a_skewed_device_stamps_its_time_off_by_the_offset(
    clients: Clients, offset_s: float
) -> None:
    fault = await faults.inject(clients, "clock-skew", SKEWED, {"offset_s": offset_s})
    try:
        before = await _stamp(clients, WITNESS)
        skewed = await _stamp(clients, SKEWED)
        after = await _stamp(clients, WITNESS)
        assert before + offset_s * S <= skewed <= after + offset_s * S
        listed = {f.id: f for f in await faults.list_all(clients)}
        assert listed[fault.id].kind == "clock-skew"
        assert "offset_s=" in listed[fault.id].detail
    finally:
        await faults.clear(clients, fault.id)
    before = await _stamp(clients, WITNESS)  # cleared: right again
    assert before <= await _stamp(clients, SKEWED) <= await _stamp(clients, WITNESS)


async def test_a_drifting_clock_gains_on_the_true_time(mini: Supernode, clients: Clients) -> None:
    fault = await faults.inject(clients, "clock-skew", SKEWED, {"drift_ppm": 100_000})
    try:
        # The witness's interval is read inside the skewed one, so however long a read takes on
        # a busy host it only lengthens the skewed interval: what the skewed clock kept over the
        # outer interval, less the true time of the inner one, is at least 10% of 20 true seconds.
        start = await _stamp(clients, SKEWED)
        start_true = await _stamp(clients, WITNESS)
        await _timeline(mini).sleep(20.0)
        end_true = await _stamp(clients, WITNESS)
        end = await _stamp(clients, SKEWED)
        gained = (end - start) - (end_true - start_true)
        assert gained >= 1.99 * S, gained  # (a nanosecond's rounding spared)
    finally:
        await faults.clear(clients, fault.id)


async def test_a_duration_the_skewed_process_keeps_ends_early_by_the_step(
    clients: Clients,
) -> None:
    """A hang meant to last 60 s, then the clock steps 45 s ahead: the hang ends after about
    15 true seconds, as a real host's timer with a deadline does when its clock is stepped."""
    hang = await faults.inject(clients, "hang", SKEWED, duration_s=60.0)
    # the hang's own start, not a stamp read after it: on a loaded host that read came more
    # than the 1 emulated s the lower bound spares (x10: 0.1 wall s) after the hang began
    start = hang.since_ns
    assert 0 < start <= await _stamp(clients, WITNESS)
    skew = await faults.inject(clients, "clock-skew", SKEWED, {"offset_s": 45})
    try:

        async def hang_over() -> bool:
            return hang.id not in {f.id for f in await faults.list_all(clients)}

        await _until(hang_over)
        ended = await _stamp(clients, WITNESS)
        assert start + 14 * S <= ended < start + 60 * S, (ended - start) / S
    finally:
        await faults.clear(clients, skew.id)
        with contextlib.suppress(EmulatorError):
            await faults.clear(clients, hang.id)


async def test_a_transfer_from_a_clock_behind_takes_its_time_on_the_fabric(
    mini: Supernode, clients: Clients
) -> None:
    """The fabric times a transfer from its issuer's stamp (its RPC's transit is not the
    transfer's), but a stamp older than any transit is a wrong clock: a device 30 s behind
    must not get its transfers done in the past, for free."""
    await _timeline(mini).sleep_until(40 * S)  # its stamps are past the epoch, 30 s behind
    fault = await faults.inject(clients, "clock-skew", SKEWED, {"offset_s": -30})
    try:
        before = await _stamp(clients, WITNESS)
        done = await _write(clients, SKEWED, "n01-npu0", 1 << 30)
        after = await _stamp(clients, WITNESS)
        took_ns = done.complete_ns - done.issue_ns
        assert took_ns > 0
        assert before <= done.issue_ns and done.complete_ns <= after  # the fabric's own time
        assert after - before >= took_ns  # and that much true time passed for it
    finally:
        await faults.clear(clients, fault.id)


async def test_bad_skews_and_targets_are_refused(clients: Clients) -> None:
    limits = DEFAULT_PROFILE.limits
    bad: list[dict[str, object]] = [
        {},  # nothing would skew
        {"offset_s": limits.clock_skew_max_s + 1},
        {"offset_s": -limits.clock_skew_max_s - 1},
        {"drift_ppm": limits.clock_drift_max_ppm * 2},
        {"offset_s": "soon"},
        {"offset_s": "inf"},
        {"skew": "3"},
    ]
    for params in bad:
        with pytest.raises(InvalidArgumentError) as err:
            await faults.inject(clients, "clock-skew", SKEWED, params)
        assert (err.value.field or "").startswith("params."), params
    raw = await _refused(
        clients.device(SKEWED).InjectFault(
            device_pb2.FaultState(
                kind="clock-skew", clock_skew=faultparams_pb2.ClockSkewParams(offset_s=1e9)
            )
        )
    )
    assert (raw.code, raw.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FAULT_PARAM")
    for target in ("l2-p0-s3", "manager", "n00-npu0~n00-l1s0"):  # a switch, a service, a link
        with pytest.raises(EmulatorError):
            await faults.inject(clients, "clock-skew", target, {"offset_s": 1})
    with pytest.raises(InvalidArgumentError, match="needs a target"):
        await faults.inject(clients, "clock-skew", "", {"offset_s": 1})
    fault = await faults.inject(clients, "clock-skew", SKEWED, {"offset_s": 1})
    try:
        again = await _refused(faults.inject(clients, "clock-skew", SKEWED, {"offset_s": 2}))
        assert (again.code, again.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "FAULT_ALREADY_ACTIVE",
        )
    finally:
        await faults.clear(clients, fault.id)


# --- the manager and a skewed process --------------------------------------------------------


@contextlib.asynccontextmanager
async def _node_process(
    sn: Supernode, node: str
) -> AsyncIterator[tuple[LivenessWatch, list[Incident]]]:
    """The node's devices as one process of their own, as procs mode makes it: one host clock
    for them all and one liveness stream stamped with it; and the cluster manager's detection
    (the real LivenessWatch) following that stream on the emulator's time."""
    local = sn.local
    assert local.time is not None
    devices = {d.id: d for d in sn.topology.devices if d.node == node}
    engines = {d: local.devices[d] for d in devices}
    host = LocalClock(local.time.timeline)
    for engine in engines.values():
        engine.clock = host
    m = DEFAULT_PROFILE.manager
    Liveness(engines, host, interval_s=m.heartbeat_interval_s, process=f"{node}-process")
    detector = Detector()
    detector.watch(list(devices))
    incidents: list[Incident] = []
    peers = Peers(sn.topology, sn.clients.credentials)
    watch = LivenessWatch(
        devices=devices,
        peers=peers,
        clock=local.time.timeline,
        detector=detector,
        interval_s=m.heartbeat_interval_s,
        misses_to_fail=m.misses_to_fail,
        on_incident=incidents.append,
        on_back=lambda _: None,
    )
    task = asyncio.create_task(watch.run())
    try:

        async def covered() -> bool:
            return watch.devices_covered == len(devices)

        await _until(covered)
        yield watch, incidents
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await peers.close()


async def _beats(watch: LivenessWatch, n: int) -> None:
    target = watch.beats + n

    async def beaten() -> bool:
        return watch.beats >= target

    await _until(beaten)


async def _stamped_off(sn: Supernode, watch: LivenessWatch, device: str, off_s: int) -> bool:
    """Whether the next beats' stamp for `device`, as the manager received it, is `off_s` off
    the manager's own time: stamped between its readings before and after, plus `off_s`."""
    before = _timeline(sn).now_ns()
    await _beats(watch, 2)
    after = _timeline(sn).now_ns()
    stamp = watch.covered[device].answered_ns[device]
    assert after - before < abs(off_s) * S  # a bracket narrower than the offset it tells
    return before + off_s * S <= stamp <= after + off_s * S


async def test_the_manager_keeps_the_devices_of_a_skewed_process_and_sees_its_stamps() -> None:
    """Ahead by 30 s, then behind by 30 s: the stamps the manager receives are off by the
    offset (the skew is real), a device hung briefly when the clock jumps ahead is not failed
    for the jump (judged on the manager's receipt too), and no healthy device is ever failed."""
    async with (
        running_supernode("cm-mini", time_scale=10.0) as sn,
        _node_process(sn, "n01") as (watch, incidents),
    ):
        clients, hung, through = sn.clients, "n01-npu1", "n01-npu0"
        stream = watch.covered[through]
        hang = await faults.inject(clients, "hang", hung)

        async def suspected() -> bool:
            return watch.detector.devices.get(hung) == SUSPECT

        await _until(suspected)
        ahead = await faults.inject(clients, "clock-skew", through, {"offset_s": 30})
        assert await _stamped_off(sn, watch, through, 30)
        assert watch.detector.devices[hung] != FAILED, incidents
        await faults.clear(clients, hang.id)
        await faults.clear(clients, ahead.id)
        behind = await faults.inject(clients, "clock-skew", through, {"offset_s": -30})
        assert await _stamped_off(sn, watch, through, -30)
        silence_s = (
            DEFAULT_PROFILE.manager.heartbeat_interval_s * DEFAULT_PROFILE.manager.misses_to_fail
        )
        await _timeline(sn).sleep(2 * silence_s)  # longer than any silence the manager fails on
        await faults.clear(clients, behind.id)
        assert incidents == []
        assert FAILED not in {watch.detector.devices[d] for d in stream.covers}


# --- procs mode: a node's process, one host clock ----------------------------------------------


# two processes' clocks, each following the authority, agree to within their sync precision
# (3.2 emulated ms apart seen in a loaded full-suite run): half a second is far below the 30 s
# under test, and the reads either side of the skewed one bound it only up to that
AGREE_NS = S // 2


async def _incidents(clients: Clients) -> list[str]:
    listed = await clients.manager().ListIncidents(manager_pb2.ListIncidentsRequest(), timeout=30)
    return [i.device for i in listed.incidents]


@pytest.mark.slow
async def test_a_node_process_skewed_in_procs_mode(tmp_path: Path) -> None:
    """A node's process skewed 30 s ahead: every device of it stamps 30 s ahead (one host clock),
    another node's do not; a second skew of the same process is refused; the manager, its own
    process, fails none of them (one hung when the clock jumps included), and time goes on."""
    options = LaunchOptions(
        preset="cm-mini",
        mode=Procs(per="node", plan=LoopbackPlan(first_octet=52), run_dir=tmp_path / "run"),
        time_scale=5.0,
    )
    async with Supernode.start(options) as sn:
        clients = Clients(sn.topology)
        try:
            witness = "n00-npu0"
            node = [d.id for d in sn.topology.devices if d.node == "n01"]
            hang = await faults.inject(clients, "hang", "n01-npu1")
            start = await _stamp(clients, witness)
            await _until_true(clients, witness, start + 2 * S)
            skew = await faults.inject(clients, "clock-skew", "n01-npu0", {"offset_s": 30})
            jumped = await _stamp(clients, witness)
            await _until_true(clients, witness, jumped + S)  # its beat, stamped ahead, judged
            await faults.clear(clients, hang.id)
            for device in [d for d in node if d != "n01-npu1"]:
                before = await _stamp(clients, witness)
                stamped = await _stamp(clients, device)
                after = await _stamp(clients, witness)
                assert before + 30 * S - AGREE_NS <= stamped <= after + 30 * S + AGREE_NS, device
            before = await _stamp(clients, witness)
            n00 = await _stamp(clients, "n00-npu1")
            assert before - AGREE_NS <= n00 <= await _stamp(clients, witness) + AGREE_NS
            again = await _refused(
                faults.inject(clients, "clock-skew", "n01-npu3", {"offset_s": -5})
            )
            assert again.reason == "FAULT_ALREADY_ACTIVE"
            m = DEFAULT_PROFILE.manager
            await _until_true(
                clients, witness, jumped + 2 * m.heartbeat_interval_s * m.misses_to_fail * S
            )
            assert not set(await _incidents(clients)) & set(node)
            # the authority (the fabric's process) takes rates, never a reading: the skewed
            # process still reports and follows, and time went on for the whole supernode
            clock = await clients.fabric().GetClock(fabric_pb2.GetClockRequest(), timeout=30)
            assert not clock.silent and clock.rate > 0
            await faults.clear(clients, skew.id)
        finally:
            await clients.close()


async def _until_true(clients: Clients, witness: str, true_ns: float) -> None:
    async def reached() -> bool:
        return await _stamp(clients, witness) >= true_ns

    await _until(reached)
