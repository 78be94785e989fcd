"""Faults act on the data path whatever a controller does (issue 20, item 2), over real gRPC and
HTTP against an in-process cm-mini with the cluster manager PASSIVE (it tells the scheduler
nothing): a crashed decode NPU fails its instance's steps, whose requests are retried or fail
visibly and which the deployment isolates itself; a slow decode NPU raises TPOT by the factor the
discrete-event simulation gives for its share, a slow prefill NPU raises TTFT and leaves TPOT;
a crashed rank fails a training job's steps (the job waits, its step counter still) and a slowed
one sets its step time. Each has its twin: the same fault on an NPU outside the workload changes
nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import yaml

from cmemu.emulator.client import faults
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.des import SlowNpu, simulate
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.model.training.spec import shape_of
from cmemu.emulator.model.training.step import gradient_buckets, groups, step_time
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import fabric_pb2, manager_pb2, scheduler_pb2, training_pb2
from tests.services.test_serving_recovery import (
    PROFILE,
    SPEC,
    TIME_SCALE,
    Deployed,
    _complete,
    _deploy,
    _until,
)


@pytest.fixture
async def sn() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-mini", time_scale=TIME_SCALE, profile=PROFILE) as supernode:
        await supernode.clients.manager().SetMode(
            manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
        )
        yield supernode


async def _outside(sn: Supernode, d: Deployed) -> str:
    """An NPU no instance of the deployment holds."""
    deployed = await d.get()
    held = {n for i in deployed.instances for n in i.npus}
    return next(x.id for x in sn.topology.devices if x.kind is DeviceKind.NPU and x.id not in held)


# --- serving: a dead decode NPU ------------------------------------------------------------------


async def test_a_crashed_decode_npu_fails_its_instance_steps_with_no_controller(
    sn: Supernode,
) -> None:
    d = await _deploy(sn, "crashy")
    requests = [asyncio.create_task(_complete(d.base, d.name, f"q{i}", 60)) for i in range(8)]
    await _until(sn, d.stats, lambda s: s.kv_slots_held >= 4)
    victim = d.npus[1]
    fault = await faults.inject(sn.clients, "crash", victim)
    isolated = await _until(sn, d.get, lambda dep: bool(dep.failed_dies))
    assert list(isolated.failed_dies) == [f"{victim}.d0", f"{victim}.d1"]
    outcomes = await asyncio.gather(*requests)
    for o in outcomes:  # finished (after a retry) or failed where the client saw it
        assert (o.finish == "length" and o.tokens == 60) or (o.finish == "error" and o.error), o
    stats = await d.stats()
    assert stats.requests_retried + stats.requests_failed >= 1  # the failed steps, visibly
    assert stats.requests_dropped == 0
    # nobody told the scheduler (the manager is passive): the deployment saw it on its own
    allocation = await sn.clients.scheduler().GetAllocation(
        scheduler_pb2.GetAllocationRequest(job=d.job)
    )
    assert not any(n.failed for n in allocation.npus)
    await faults.clear(sn.clients, fault.id)
    await _until(sn, d.get, lambda dep: dep.health == "serving" and not dep.failed_dies)
    after = await _complete(d.base, d.name, "after", 8)
    assert after.finish == "length" and after.tokens == 8


async def test_a_down_die_is_isolated_by_the_deployment_and_restored_once_whole(
    sn: Supernode,
) -> None:
    """The fabric names the dead rank: the deployment takes its NPU out at once (a down die
    answers its health checks, so probing alone would not), and back once it is whole."""
    d = await _deploy(sn, "halfdead")
    requests = [asyncio.create_task(_complete(d.base, d.name, f"q{i}", 40)) for i in range(6)]
    await _until(sn, d.stats, lambda s: s.kv_slots_held >= 4)
    victim = d.npus[2]
    fault = await faults.inject(sn.clients, "die-down", victim, {"die": "1"})
    isolated = await _until(sn, d.get, lambda dep: bool(dep.failed_dies))
    assert list(isolated.failed_dies) == [f"{victim}.d0", f"{victim}.d1"]
    outcomes = await asyncio.gather(*requests)
    for o in outcomes:
        assert (o.finish == "length" and o.tokens == 40) or (o.finish == "error" and o.error), o
    assert (await d.get()).failed_dies  # still out while its die is down
    await faults.clear(sn.clients, fault.id)
    back = await _until(sn, d.get, lambda dep: dep.health == "serving" and not dep.failed_dies)
    assert victim in next(i for i in back.instances if i.role == "decode").npus
    assert (await d.stats()).requests_dropped == 0


async def test_a_crashed_npu_outside_every_instance_changes_nothing(sn: Supernode) -> None:
    d = await _deploy(sn, "bystander")
    requests = [asyncio.create_task(_complete(d.base, d.name, f"q{i}", 60)) for i in range(8)]
    await _until(sn, d.stats, lambda s: s.kv_slots_held >= 4)
    fault = await faults.inject(sn.clients, "crash", await _outside(sn, d))
    outcomes = await asyncio.gather(*requests)
    assert all(o.finish == "length" and o.tokens == 60 for o in outcomes), outcomes
    stats = await d.stats()
    assert (stats.requests_retried, stats.requests_failed, stats.requests_dropped) == (0, 0, 0)
    assert not (await d.get()).failed_dies
    await faults.clear(sn.clients, fault.id)


# --- serving: a slow NPU -------------------------------------------------------------------------


def _simulated(slow: list[SlowNpu], prompt: int, tokens: int) -> tuple[float, float]:
    """(TTFT, TPOT) of one request alone, by the discrete-event simulation."""
    deployment = parse_deployment(yaml.safe_load(json.dumps(SPEC)), PROFILE)
    request = Request(id="r", arrival_s=0.0, input_tokens=prompt, output_tokens=tokens)
    sim = simulate(deployment, [request], profile=PROFILE, slow=slow)
    return sim.recorder.ttft()[0], sim.recorder.tpot()["r"]


class Latest:
    """Per-request TTFT and TPOT from the cumulative stats: each request served alone."""

    def __init__(self, d: Deployed) -> None:
        self.d = d
        self.count = 0
        self.ttft_sum = 0
        self.tpot_sum = 0

    async def one(self, prompt: str, tokens: int) -> tuple[float, float]:
        done = await _complete(self.d.base, self.d.name, prompt, tokens)
        assert done.finish == "length" and done.tokens == tokens, done
        s = await self.d.stats()
        self.count += 1
        assert s.ttft.count == s.tpot.count == self.count
        ttft = s.ttft.mean_ns * self.count - self.ttft_sum
        tpot = s.tpot.mean_ns * self.count - self.tpot_sum
        self.ttft_sum += ttft
        self.tpot_sum += tpot
        return ttft / 1e9, tpot / 1e9


async def _slowed(sn: Supernode, npu: str, measure: Awaitable[Any]) -> Any:
    fault = await faults.inject(sn.clients, "slow", npu, {"compute": "0.5"})
    try:
        return await measure
    finally:
        await faults.clear(sn.clients, fault.id)


async def test_a_slow_decode_npu_raises_tpot_by_its_share_a_slow_prefill_npu_ttft(
    sn: Supernode,
) -> None:
    d = await _deploy(sn, "sluggish")
    deployed = await d.get()
    prefill = next(i for i in deployed.instances if i.role == "prefill")
    latest = Latest(d)
    prompt = "the same prompt, served alone each time"
    base_ttft, base_tpot = await latest.one(prompt, 40)
    # the twin first: a slow NPU of the other instance leaves TPOT, slows prefill
    pre_ttft, pre_tpot = await _slowed(sn, prefill.npus[0], latest.one(prompt, 40))
    dec_ttft, dec_tpot = await _slowed(sn, d.npus[1], latest.one(prompt, 40))
    again_ttft, again_tpot = await latest.one(prompt, 40)

    tokens = (await d.stats()).prompt_tokens // latest.count  # the same prompt each time
    sim = {
        name: _simulated(slow, tokens, 40)
        for name, slow in (
            ("base", []),
            ("prefill", [SlowNpu("prefill-0", 0, 0.5)]),
            ("decode", [SlowNpu("decode-0", 1, 0.5)]),
        )
    }
    tpot_factor = sim["decode"][1] / sim["base"][1]
    assert tpot_factor > 1.5  # the factor the share implies: the simulation's, not a guess
    assert dec_tpot / base_tpot == pytest.approx(tpot_factor, rel=0.03)
    assert pre_tpot == pytest.approx(base_tpot, rel=0.01)  # the twin: another instance
    assert again_tpot == pytest.approx(base_tpot, rel=0.01)  # cleared: back to normal
    ttft_factor = sim["prefill"][0] / sim["base"][0]
    assert ttft_factor > 1.3  # (a prompt shorter than a block: no prefix hit in EMS)
    assert pre_ttft / base_ttft == pytest.approx(ttft_factor, rel=0.05)
    assert dec_ttft == pytest.approx(base_ttft, rel=0.02)  # prefill's instance is not slowed
    assert again_ttft == pytest.approx(base_ttft, rel=0.02)


# --- training ------------------------------------------------------------------------------------


async def _job(sn: Supernode, name: str) -> training_pb2.TrainingJob:
    return await sn.clients.training().Get(training_pb2.TrainingRequest(name=name))


async def _start(sn: Supernode, name: str) -> training_pb2.TrainingJob:
    spec = training_pb2.TrainingSpec(name=name, npus=2, steps=0, checkpoint_every=1000)
    await sn.clients.training().Start(training_pb2.StartTrainingRequest(spec=spec))
    started: training_pb2.TrainingJob = await _until(
        sn, lambda: _job(sn, name), lambda j: j.step >= 2
    )
    return started


def _past(step: int) -> Callable[[training_pb2.TrainingJob], bool]:
    return lambda j: j.step >= step


async def test_a_crashed_rank_fails_training_steps_and_the_job_waits(sn: Supernode) -> None:
    job = await _start(sn, "t-crash")
    fault = await faults.inject(sn.clients, "crash", job.npus[1])
    failed = await _until(sn, lambda: _job(sn, "t-crash"), lambda j: j.failed_steps >= 3)
    assert failed.state == "running" and failed.restarts == 0  # waiting, not failed
    held = await _until(sn, lambda: _job(sn, "t-crash"), lambda j: j.failed_steps >= 5)
    assert held.step == failed.step  # no step completes while a rank is dead
    await faults.clear(sn.clients, fault.id)
    await _until(sn, lambda: _job(sn, "t-crash"), lambda j: j.step >= held.step + 2)
    # the twin: a crash outside the job
    other = next(
        x.id for x in sn.topology.devices if x.kind is DeviceKind.NPU and x.id not in job.npus
    )
    before = await _job(sn, "t-crash")
    fault = await faults.inject(sn.clients, "crash", other)
    after = await _until(sn, lambda: _job(sn, "t-crash"), lambda j: j.step >= before.step + 3)
    assert after.failed_steps == before.failed_steps
    await faults.clear(sn.clients, fault.id)


async def test_a_slow_rank_sets_the_training_step_time(sn: Supernode) -> None:
    job = await _start(sn, "t-slow")
    shape = shape_of(name="t-slow", npus=2, steps=0, checkpoint_every=1000, profile=PROFILE)
    dies = [f"{n}.d{k}" for n in job.npus for k in range(PROFILE.npu.dies)]
    ranks = list(groups(dies, shape).data_parallel)
    bucket = gradient_buckets(shape, PROFILE).bytes

    async def expected() -> float:
        result = await sn.clients.fabric().Collective(
            fabric_pb2.CollectiveRequest(
                op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, ranks=ranks, bytes=bucket
            )
        )
        return step_time(
            shape,
            dispatch_s=0.0,
            combine_s=0.0,
            allreduce_bucket_s=result.duration_ns / 1e9,
            profile=PROFILE,
            compute_share=result.compute_share,
        ).total_s

    normal = await expected()
    assert job.step_s == pytest.approx(normal, rel=1e-9)
    outside = next(
        x.id for x in sn.topology.devices if x.kind is DeviceKind.NPU and x.id not in job.npus
    )
    for npu, slowed in ((outside, False), (job.npus[1], True)):
        fault = await faults.inject(sn.clients, "slow", npu, {"compute": "0.5"})
        want = await expected()
        assert (want > normal * 1.2) is slowed  # compute at half pace, the all-reduce not
        got = await _until(
            sn, lambda: _job(sn, "t-slow"), _past((await _job(sn, "t-slow")).step + 2)
        )
        assert got.step_s == pytest.approx(want, rel=1e-9)
        await faults.clear(sn.clients, fault.id)
