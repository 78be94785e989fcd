"""The cluster manager's engine acting, end to end over real gRPC on an in-process cm-mini:
detection of a device down, a crash-like broken stream and a hang by missed heartbeats;
isolation and replacement through the real scheduler; a training job restarting from its EMS
checkpoint on a spare; passive mode recording without acting (and an example controller
acting in its place). The servicer's own checks are tests/services/test_manager.py."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cmemu.emulator.client import faults
from cmemu.emulator.runtime.supernode import EMBEDDED
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import device_pb2, manager_pb2, scheduler_pb2, training_pb2
from tests.runtime.test_mqtt import listening

T = TypeVar("T")
SCALE = 50.0  # emulated seconds per wall second: a 20 s training step takes 0.4 s


async def until(
    probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], *, wall_s: float = 600.0
) -> T:
    """Poll `probe` until `ok` holds (a condition, not a timed assert: the bound only stops a
    hung test; a busy host slows emulated time, and so what is waited for, in wall time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wall_s
    while True:
        value = await probe()
        if ok(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition never held; last value: {value}")
        await asyncio.sleep(0.05)


def incidents(clients: Clients) -> Callable[[], Awaitable[list[manager_pb2.Incident]]]:
    async def probe() -> list[manager_pb2.Incident]:
        reply = await clients.manager().ListIncidents(manager_pb2.ListIncidentsRequest())
        return list(reply.incidents)

    return probe


def failed_npus(clients: Clients) -> Callable[[], Awaitable[int]]:
    """How many NPUs the scheduler holds out of service, as a probe for `until`."""

    async def probe() -> int:
        reply = await clients.scheduler().ListAllocations(scheduler_pb2.ListAllocationsRequest())
        return reply.failed_npus

    return probe


async def down(clients: Clients, device: str, faulted: bool = True) -> None:
    await clients.device(device).SetFaultState(
        device_pb2.FaultState(faulted=faulted, reason="test")
    )


async def test_training_restarts_from_its_checkpoint_on_a_spare() -> None:
    async with (
        running_supernode("cm-mini", time_scale=SCALE, broker=EMBEDDED) as sn,
        listening(sn.topology.broker or "") as events,
    ):
        clients = sn.clients
        spec = training_pb2.TrainingSpec(name="t1", npus=4, steps=0, checkpoint_every=2)
        started = await clients.training().Start(training_pb2.StartTrainingRequest(spec=spec))
        assert started.state in ("starting", "running") and len(started.npus) == 4

        async def job() -> training_pb2.TrainingJob:
            return await clients.training().Get(training_pb2.TrainingRequest(name="t1"))

        await until(job, lambda j: j.last_checkpoint_step >= 2 and j.step > j.last_checkpoint_step)
        victim = started.npus[1]
        await down(clients, victim)
        recovered = await until(job, lambda j: j.restarts == 1 and j.state == "running")
        assert victim not in recovered.npus and len(recovered.npus) == 4
        assert recovered.steps_lost >= 1 and recovered.last_restored_ns > recovered.last_failure_ns
        found = await until(incidents(clients), lambda xs: any(i.state == "restored" for i in xs))
        inc = next(i for i in found if i.device == victim)
        assert inc.detected_by == "health" and inc.jobs == ["t1"]
        assert inc.replacements and inc.replacements[0] in recovered.npus
        assert 0 < inc.fault_ns <= inc.detected_ns <= inc.isolated_ns <= inc.replaced_ns
        assert inc.replaced_ns <= inc.restored_ns
        allocation = await clients.scheduler().GetAllocation(
            scheduler_pb2.GetAllocationRequest(job="t1")
        )
        assert victim not in [n.id for n in allocation.npus]
        # the workload says what it isolated and restored, the manager what it did
        await events.wait_for(lambda: events.named("training", "restored"))
        isolated = events.named("training", "isolated")[0]
        assert (isolated["job"], isolated["npus"]) == ("t1", [victim])
        assert isolated["emulated_ns"] >= inc.detected_ns
        restored = events.named("training", "restored")[0]
        assert (restored["job"], restored["npus"]) == ("t1", list(inc.replacements))
        await events.wait_for(lambda: events.named("manager", "incident-restored"))
        assert events.named("manager", "incident")[0]["target"] == victim
        assert events.named("manager", "incident-replaced")[0]["replacements"] == list(
            inc.replacements
        )
        stopped = await clients.training().Stop(training_pb2.TrainingRequest(name="t1"))
        assert stopped.name == "t1"
        await until(job, lambda j: j.state == "stopped")


async def test_a_hang_is_failed_by_missed_heartbeats_and_its_job_replaced() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        alloc = await clients.scheduler().Allocate(
            scheduler_pb2.AllocateRequest(job="j-hang", npus=2)
        )
        victim = alloc.npus[0].id
        await faults.inject(clients, "hang", victim)
        found = await until(incidents(clients), lambda xs: any(i.state == "replaced" for i in xs))
        inc = next(i for i in found if i.device == victim)
        assert inc.detected_by == "heartbeat" and "heartbeats missed" in inc.detail
        assert inc.jobs == ["j-hang"] and len(inc.replacements) == 1
        now = await clients.scheduler().GetAllocation(
            scheduler_pb2.GetAllocationRequest(job="j-hang")
        )
        assert victim not in [n.id for n in now.npus] and inc.replacements[0] in [
            n.id for n in now.npus
        ]
        assert sn.local.metrics is not None  # what it costs and finds, for Prometheus
        async with (
            aiohttp.ClientSession() as session,
            session.get(sn.local.metrics.url) as response,
        ):
            text = await response.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        beats = families["cmemu_manager_liveness_beats"].samples[0].value
        streams = families["cmemu_manager_liveness_streams"].samples[0].value
        assert beats >= 3 and streams == 1  # one process: one stream for every device
        failed = [
            x.value
            for x in families["cmemu_manager_devices"].samples
            if x.labels["state"] == "failed"
        ]
        assert failed == [1.0]
        await faults.clear(clients, faults.device_fault_id(victim, "hang"))


async def test_a_die_down_takes_its_npu_out_of_the_job() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        alloc = await clients.scheduler().Allocate(
            scheduler_pb2.AllocateRequest(job="j-die", npus=2)
        )
        npu = alloc.npus[0].id
        fault = await faults.inject(clients, "die-down", npu, {"die": 1})
        found = await until(incidents(clients), lambda xs: any(i.state == "replaced" for i in xs))
        inc = found[0]
        assert (inc.device, inc.detected_by, list(inc.jobs)) == (f"{npu}.d1", "health", ["j-die"])
        now = await clients.scheduler().GetAllocation(
            scheduler_pb2.GetAllocationRequest(job="j-die")
        )
        assert npu not in [n.id for n in now.npus]
        await faults.clear(clients, fault.id)

        await until(
            failed_npus(clients), lambda n: n == 0
        )  # the die is back: the NPU back in service


@pytest.mark.parametrize("active", [True, False])
async def test_uncorrectable_hbm_ecc_takes_the_npu_out_of_its_job_until_repaired(
    active: bool,
) -> None:
    """An NPU reporting uncorrectable HBM ECC errors answers, but its data is lost: the manager
    isolates it and moves its job to a spare, and returns it to the pool once the poison is gone.
    The twin: a passive manager records the incident and moves nothing."""
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        if not active:
            await clients.manager().SetMode(
                manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
            )
        alloc = await clients.scheduler().Allocate(
            scheduler_pb2.AllocateRequest(job="j-ecc", npus=2)
        )
        npu = alloc.npus[0].id
        ecc = await faults.inject(clients, "hbm-ecc", npu, {"offset": 0, "size": 4096})
        state = "replaced" if active else "detected"
        found = await until(
            incidents(clients), lambda xs: any(i.detected_by == "ecc" and state == i.state
                                                and (active or "passive" in i.detail) for i in xs)
        )  # fmt: skip
        inc = next(i for i in found if i.detected_by == "ecc")
        assert inc.device == npu and "uncorrectable HBM ECC" in inc.detail
        assert list(inc.jobs) == (["j-ecc"] if active else [])
        now = await clients.scheduler().GetAllocation(
            scheduler_pb2.GetAllocationRequest(job="j-ecc")
        )
        assert (npu in [n.id for n in now.npus]) is not active
        await faults.clear(clients, ecc.id)  # scrubbed: nothing poisoned is left
        await until(failed_npus(clients), lambda n: n == 0)  # back in the pool
        status = await clients.manager().GetStatus(manager_pb2.GetManagerStatusRequest())
        assert status.devices_failed == 0


async def test_a_crash_is_detected_by_health() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        victim = "n00-npu5"
        crash = await faults.inject(clients, "crash", victim)
        found = await until(
            incidents(clients), lambda xs: any(i.device == victim and i.isolated_ns for i in xs)
        )
        inc = next(i for i in found if i.device == victim)
        # the crash closes the server: its process's liveness says it is unreachable at once
        assert inc.detected_by == "health" and "unreachable" in inc.detail
        assert inc.state == "isolated" and not inc.jobs  # no job held it

        assert await failed_npus(clients)() == 1
        # restarted, it answers again: restored, and back in the scheduler's pool (its dies had
        # failed with it and never answered on their own, so it once stayed out for good: each
        # crash or container kill shrank the pool)
        await faults.clear(clients, crash.id)
        await until(incidents(clients), lambda xs: any(i.state == "restored" for i in xs))
        await until(failed_npus(clients), lambda n: n == 0)


async def test_passive_mode_records_but_does_not_act() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        status = await clients.manager().SetMode(
            manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
        )
        assert status.mode == manager_pb2.MANAGER_MODE_PASSIVE
        alloc = await clients.scheduler().Allocate(
            scheduler_pb2.AllocateRequest(job="j-passive", npus=1)
        )
        victim = alloc.npus[0].id
        await down(clients, victim)
        found = await until(
            incidents(clients), lambda xs: any("passive" in i.detail and i.fault_ns for i in xs)
        )
        inc = found[0]
        assert inc.state == "detected" and inc.isolated_ns == 0 and "passive" in inc.detail
        assert inc.fault_ns > 0  # the device said when its fault began
        now = await clients.scheduler().GetAllocation(
            scheduler_pb2.GetAllocationRequest(job="j-passive")
        )
        assert [n.id for n in now.npus] == [victim] and not now.npus[0].failed
        status = await clients.manager().GetStatus(manager_pb2.GetManagerStatusRequest())
        assert status.devices_failed == 1 and status.open_incidents == 1
        assert status.devices_watched == len(sn.topology.devices)


def _example(name: str) -> ModuleType:
    """A file of examples/ as a user runs it (not a package)."""
    path = Path(__file__).parents[3] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_example_controller_replaces_with_the_reference_one_passive() -> None:
    controller = _example("minimal_controller")
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        alloc = await clients.scheduler().Allocate(
            scheduler_pb2.AllocateRequest(job="mine", npus=2)
        )
        victim = alloc.npus[1].id
        await faults.inject(clients, "hang", victim)
        replaced = await asyncio.wait_for(controller.control(clients, misses=2, until=1), 120)
        assert list(replaced) == [victim] and len(replaced[victim]) == 1
        now = await clients.scheduler().GetAllocation(
            scheduler_pb2.GetAllocationRequest(job="mine")
        )
        assert replaced[victim][0] in [n.id for n in now.npus]
        status = await clients.manager().GetStatus(manager_pb2.GetManagerStatusRequest())
        assert status.mode == manager_pb2.MANAGER_MODE_PASSIVE
        await faults.clear(clients, faults.device_fault_id(victim, "hang"))


@pytest.mark.parametrize("back", [True, False])
async def test_a_device_back_while_it_is_being_isolated_is_restored(back: bool) -> None:
    """A partition shorter than the isolation (the engine test's reconnected container): the
    device answers again while the manager's MarkFailed is still in flight (held here by a hung
    scheduler), and its incident, restored then, stays restored once the isolation ends; it
    was overwritten with `isolated`, and nothing ever moved it on. The twin: a device still
    down when the isolation ends stays isolated.

    The device comes back only once the manager has published the incident: that is when it
    has decided to act (the incident is listed as soon as it is detected, before the manager
    looks at it; a device back by then is never acted on, rightly, and is not this case)."""
    async with (
        running_supernode("cm-mini", time_scale=SCALE, broker=EMBEDDED) as sn,
        listening(sn.topology.broker or "") as events,
    ):
        clients = sn.clients
        victim = "n00-npu5"
        hung = await faults.inject(clients, "service-hang", "scheduler")
        await down(clients, victim)
        await events.wait_for(lambda: events.named("manager", "incident"), within_s=600)
        await until(incidents(clients), lambda xs: any(i.device == victim for i in xs))
        if back:
            await down(clients, victim, faulted=False)
            early = await until(
                incidents(clients), lambda xs: any(i.state == "restored" for i in xs)
            )
            assert early[0].isolated_ns == 0  # back before the scheduler answered
        await faults.clear(clients, hung.id)  # MarkFailed answers: the isolation ends
        found = await until(incidents(clients), lambda xs: any(i.isolated_ns for i in xs))
        inc = next(i for i in found if i.device == victim)
        assert inc.state == ("restored" if back else "isolated"), inc
        assert inc.restored_ns if back else not inc.restored_ns
