"""The discrete-event simulator: a workload through the engine, every plan answered by pure
models (comm.py for collectives and KV transfers, prefix.py for EMS hits), in emulated time, with
no gRPC: hours of traffic in seconds. Deterministic: the same inputs give the same report."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.serving import cost
from emulator.model.serving.comm import CommModel
from emulator.model.serving.deployment import Deployment, instance_dies, layout
from emulator.model.serving.engine import (
    Engine,
    PlanKind,
    Request,
    StepPlan,
    StepResult,
)
from emulator.model.serving.models import get_model
from emulator.model.serving.prefix import PrefixCache, default_capacity_bytes
from emulator.model.serving.report import Recorder, Report, summarize
from emulator.model.topology import DeviceKind, Topology, build


@dataclass
class Simulation:
    report: Report
    engine: Engine
    recorder: Recorder
    cache: PrefixCache


_COMMS: dict[tuple[int, str, int], tuple[Topology, HardwareProfile, CommModel]] = {}


def _comm(topology: Topology, platform: str, profile: HardwareProfile) -> CommModel:
    """One CommModel per (topology, platform, profile): its link graph and memoised collectives
    are pure functions of those, so runs over the same platform share them."""
    key = (id(topology), platform, id(profile))
    found = _COMMS.get(key)
    if found is None or found[0] is not topology or found[1] is not profile:
        found = (topology, profile, CommModel(topology, platform, profile))
        _COMMS[key] = found
    return found[2]


@cache
def _topology(preset: str) -> Topology:
    return build(preset)


class Oracle:
    """Answers the engine's plans from the pure models."""

    def __init__(
        self,
        deployment: Deployment,
        topology: Topology,
        profile: HardwareProfile = DEFAULT_PROFILE,
    ) -> None:
        self.profile = profile
        npus = [d.id for d in topology.devices if d.kind is DeviceKind.NPU]
        self.layout = layout(deployment, npus)
        self.dies = {i: instance_dies(n, profile) for i, n in self.layout.items()}
        self.comm = _comm(topology, deployment.platform, profile)
        model = get_model(deployment.model)
        per_block = cost.kv_bytes_per_token(model, profile) * profile.serving.block_tokens
        self.kv_bytes_per_block = per_block
        capacity = deployment.ems.capacity_bytes or default_capacity_bytes(deployment.npus, profile)
        self.cache = PrefixCache(int(capacity // per_block))
        self._moe: dict[tuple[str, int, int], StepResult] = {}

    def answer(self, plan: StepPlan) -> StepResult:
        if plan.kind is PlanKind.LOOKUP:
            return StepResult(
                matched_blocks=self.cache.match(plan.block_keys),
                lookup_s=self.profile.serving.ems_lookup_s,
            )
        if plan.kind is PlanKind.TRANSFER:
            assert plan.transfer is not None
            self.cache.insert(plan.block_keys)
            t = plan.transfer
            return StepResult(
                transfer_s=self.comm.kv_transfer_s(
                    t.bytes, self.layout[t.src][0], self.layout[t.dst][0]
                )
            )
        assert plan.moe is not None
        key = (plan.instance, plan.moe.ranks, plan.moe.tokens_per_rank)
        found = self._moe.get(key)
        if found is None:
            ranks = self.dies[plan.instance][: plan.moe.ranks]
            dispatch, combine = self.comm.moe(ranks, plan.moe.tokens_per_rank)
            found = self._moe[key] = StepResult(dispatch_s=dispatch, combine_s=combine)
        return found


def simulate(
    deployment: Deployment,
    requests: Iterable[Request],
    *,
    duration_s: float | None = None,
    profile: HardwareProfile = DEFAULT_PROFILE,
    topology: Topology | None = None,
    stream_tokens: bool = False,
) -> Simulation:
    """Run `requests` (in arrival order) through the engine. With `duration_s` the run stops
    there (requests arriving later are not submitted; the report covers [0, duration_s]);
    without, it runs until every request has finished."""
    oracle = Oracle(deployment, topology or _topology(deployment.preset), profile)
    engine = Engine(deployment, profile=profile, stream_tokens=stream_tokens)
    recorder = Recorder()
    arrivals = iter(requests)
    pending = next(arrivals, None)
    end = float("inf") if duration_s is None else duration_s
    now = 0.0
    while True:
        due = engine.next_due_time()
        t_arrival = pending.arrival_s if pending is not None else float("inf")
        now = min(t_arrival, due if due is not None else float("inf"))
        if now == float("inf") or now > end:
            break
        while pending is not None and pending.arrival_s <= now:
            engine.submit(pending, now)
            recorder.submitted(pending)
            pending = next(arrivals, None)
        step = engine.advance(now)
        for event in step.events:
            recorder.record(event)
        for plan in step.plans:
            engine.report(plan.id, oracle.answer(plan))
    elapsed = end if duration_s is not None else recorder.last_s
    report = summarize(
        recorder,
        engine.stats,
        deployment,
        elapsed,
        kv_bytes_per_block=oracle.kv_bytes_per_block,
        profile=profile,
    )
    return Simulation(report=report, engine=engine, recorder=recorder, cache=oracle.cache)


def merge_sorted(*streams: Iterable[Request]) -> list[Request]:
    """Several request streams as one, in arrival order."""
    return list(heapq.merge(*streams, key=lambda r: r.arrival_s))
