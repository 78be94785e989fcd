"""Gray failures found by the cluster manager over real gRPC on an in-process cm-mini: a training
job with one NPU slowed (compute 0.2) makes that NPU arrive last at the job's collectives; the
manager opens a "straggler" incident naming it within a bound in emulated time and (ACTIVE)
isolates and replaces it, and the job restores on a spare; once the fault is cleared a diagnostic
kernel returns the NPU to service. PASSIVE records the same incident and acts on nothing. The
healthy steps before each fault are the twin: the same job with no fault opens no incident."""

from __future__ import annotations

import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from cmemu.emulator.client import faults
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.manager.detector import STRAGGLER
from cmemu.emulator.model.naming import device_of
from cmemu.emulator.runtime.supernode import EMBEDDED
from cmemu.emulator.testing import Clients, Supernode, running_supernode
from cmemu.v1 import fabric_pb2, manager_pb2, scheduler_pb2, training_pb2
from tests.engines.manager.test_actions import incidents, until
from tests.runtime.test_mqtt import listening

SCALE = 100.0  # a 13 s training step takes an eighth of a wall second
COMPUTE = 0.2
HEALTHY_STEPS = 3  # the twin: this many steps with no fault open no incident


async def _metrics(sn: Supernode) -> dict[tuple[str, str], float]:
    assert sn.local.metrics is not None
    async with aiohttp.ClientSession() as session, session.get(sn.local.metrics.url) as response:
        text = await response.text()
    return {
        (s.name, s.labels.get("state", "")): s.value
        for f in text_string_to_metric_families(text)
        if f.name.startswith("cmemu_manager_")
        for s in f.samples
    }


async def _healthy_job(clients: Clients, name: str) -> training_pb2.TrainingJob:
    """A job that ran HEALTHY_STEPS steps with no fault, and the manager found nothing: the
    check the slowed run must fail."""
    spec = training_pb2.TrainingSpec(name=name, npus=2, steps=0, checkpoint_every=5)
    await clients.training().Start(training_pb2.StartTrainingRequest(spec=spec))

    async def job() -> training_pb2.TrainingJob:
        return await clients.training().Get(training_pb2.TrainingRequest(name=name))

    healthy = await until(job, lambda j: j.step >= HEALTHY_STEPS)
    assert await incidents(clients)() == []
    return healthy


def _bound_ns(job: training_pb2.TrainingJob) -> int:
    """The step in flight, then as many slowed steps as the judge needs late arrivals (a step
    runs one collective, its compute at most 1/COMPUTE as long)."""
    m = DEFAULT_PROFILE.manager
    late = math.ceil(m.straggler_samples * m.straggler_consistency)
    return round(job.step_s * (1 + late / COMPUTE) * 1e9)


async def test_a_slow_npu_in_a_job_is_a_straggler_isolated_replaced_and_returned() -> None:
    async with (
        running_supernode("cm-mini", time_scale=SCALE, broker=EMBEDDED) as sn,
        listening(sn.topology.broker or "") as events,
    ):
        clients = sn.clients
        healthy = await _healthy_job(clients, "slowed")
        judged = (await _metrics(sn))[("cmemu_manager_collective_arrivals_total", "")]
        assert judged >= HEALTHY_STEPS  # the manager did look at the healthy job's collectives
        victim = healthy.npus[1]
        await faults.inject(clients, "slow", victim, {"compute": COMPUTE})
        found = await until(incidents(clients), lambda xs: any(i.state == "restored" for i in xs))
        (inc,) = found
        assert (inc.device, inc.detected_by) == (victim, STRAGGLER), inc
        assert "as late as the median rank" in inc.detail
        assert 0 < inc.fault_ns <= inc.detected_ns <= inc.fault_ns + _bound_ns(healthy)
        assert inc.detected_ns <= inc.isolated_ns <= inc.replaced_ns <= inc.restored_ns
        assert inc.jobs == ["slowed"] and len(inc.replacements) == 1
        job = await clients.training().Get(training_pb2.TrainingRequest(name="slowed"))
        assert victim not in job.npus and inc.replacements[0] in job.npus and job.restarts == 1
        await events.wait_for(lambda: events.named("manager", "straggler"))
        assert events.named("manager", "straggler")[0]["target"] == victim
        m = await _metrics(sn)
        assert m[("cmemu_manager_stragglers_detected_total", "")] == 1
        assert m[("cmemu_manager_devices", "degraded")] == 1
        # what the manager read, as any controller can: the victim's dies were ready last
        read = await clients.fabric().ListCollectiveArrivals(
            fabric_pb2.ListCollectiveArrivalsRequest(after_seq=0)
        )
        late = [a for a in read.arrivals if a.ready_ns]
        assert late and read.last_seq == read.arrivals[-1].seq
        slowest = {a.ranks[max(range(len(a.ranks)), key=lambda k: a.ready_ns[k])] for a in late}
        assert {device_of(r) for r in slowest} == {victim}
        # repaired: a diagnostic kernel at its roofline puts it back among the spares
        await faults.remove_all(clients)
        await events.wait_for(lambda: events.named("manager", "device-back"))
        assert events.named("manager", "device-back")[0]["target"] == victim
        assert (await _metrics(sn))[("cmemu_manager_devices", "degraded")] == 0
        # every NPU but the job's two and the one spare held back: the victim's among them
        # (still failed, only 12 would be free)
        free = await clients.scheduler().Allocate(
            scheduler_pb2.AllocateRequest(job="after-repair", npus=13)
        )
        spares = await clients.scheduler().GetSpares(scheduler_pb2.GetSparesRequest())
        assert victim in [*[n.id for n in free.npus], *spares.npus]


async def test_passive_records_a_straggler_and_leaves_it_in_its_job() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        clients = sn.clients
        await clients.manager().SetMode(
            manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
        )
        healthy = await _healthy_job(clients, "passive")
        victim = healthy.npus[0]
        fault = await faults.inject(clients, "slow", victim, {"compute": COMPUTE})
        (inc,) = await until(
            incidents(clients), lambda xs: "passive" in "".join(x.detail for x in xs)
        )
        assert (inc.device, inc.detected_by, inc.state) == (victim, STRAGGLER, "detected")
        assert 0 < inc.fault_ns <= inc.detected_ns <= inc.fault_ns + _bound_ns(healthy)
        assert inc.isolated_ns == 0 and inc.jobs == []
        job = await clients.training().Get(training_pb2.TrainingRequest(name="passive"))
        assert victim in job.npus and job.restarts == 0
        await faults.clear(clients, fault.id)  # the device itself is the recovery
        (inc,) = await until(incidents(clients), lambda xs: xs[0].state == "restored")
        assert inc.restored_ns > inc.detected_ns
