"""The discrete-event simulator: a workload through the engine, every plan answered by pure
models (comm.py for collectives and KV transfers, prefix.py for EMS hits), in emulated time, with
no gRPC: hours of traffic in seconds. Deterministic: the same inputs give the same report.

A failure schedule (`DieLoss`) takes an NPU of an instance out at an instant and brings it (or a
replacement NPU) back at another, as the live driver does when the scheduler marks the NPU failed
and replaces it: the engine isolates and restores the same dies at the same instants, so the two
agree under a fault too."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.comm import comm_model, topology_for
from cmemu.emulator.model.serving.deployment import Deployment, instance_dies, layout
from cmemu.emulator.model.serving.engine import (
    Engine,
    PlanKind,
    Request,
    StepPlan,
    StepResult,
    rank_dies,
)
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.prefix import PrefixCache, default_capacity_bytes
from cmemu.emulator.model.serving.report import Recorder, Report, summarize
from cmemu.emulator.model.topology import DeviceKind, Topology


@dataclass(frozen=True, kw_only=True)
class DieLoss:
    """NPU number `npu` of `instance` (its index in the instance's NPUs) fails at `at_s` (both
    its dies isolated) and is back at `restored_s` (None: never), as `replacement` (an NPU id;
    None: the same NPU)."""

    at_s: float
    instance: str
    npu: int
    restored_s: float | None = None
    replacement: str | None = None


@dataclass(frozen=True)
class SlowNpu:
    """NPU number `npu` of `instance` computes at `compute` of its speed for the whole run (a
    `slow` fault): the instance's steps run at its pace (the live fabric reports the same share
    with the step's collectives)."""

    instance: str
    npu: int
    compute: float


@dataclass
class Simulation:
    report: Report
    engine: Engine
    recorder: Recorder
    cache: PrefixCache


class Oracle:
    """Answers the engine's plans from the pure models."""

    def __init__(
        self,
        deployment: Deployment,
        topology: Topology,
        profile: HardwareProfile = DEFAULT_PROFILE,
        slow: Sequence[SlowNpu] = (),
    ) -> None:
        self.profile = profile
        self.shares: dict[str, float] = {}  # instance: its slowest NPU's compute share
        for s in slow:
            self.shares[s.instance] = min(self.shares.get(s.instance, 1.0), s.compute)
        npus = [d.id for d in topology.devices if d.kind is DeviceKind.NPU]
        self.layout = layout(deployment, npus)
        self.dies = {i: instance_dies(n, profile) for i, n in self.layout.items()}
        self.comm = comm_model(topology, deployment.platform, profile)
        model = get_model(deployment.model)
        per_block = cost.kv_bytes_per_token(model, profile) * profile.serving.block_tokens
        self.kv_bytes_per_block = per_block
        capacity = deployment.ems.capacity_bytes or default_capacity_bytes(deployment.npus, profile)
        self.cache = PrefixCache(int(capacity // per_block))
        self._moe: dict[tuple[str, int, int, tuple[int, ...]], StepResult] = {}
        self.npu_dies = profile.npu.dies

    def replace(self, instance: str, npu: int, new: str) -> None:
        """NPU number `npu` of `instance` is now `new` (a replacement)."""
        npus = list(self.layout[instance])
        npus[npu] = new
        self.layout[instance] = tuple(npus)
        self.dies[instance] = instance_dies(npus, self.profile)
        self._moe = {k: v for k, v in self._moe.items() if k[0] != instance}

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
                    t.bytes, self.layout[t.src][t.src_npu], self.layout[t.dst][t.dst_npu]
                )
            )
        assert plan.moe is not None
        key = (plan.instance, plan.moe.ranks, plan.moe.tokens_per_rank, plan.moe.lost)
        found = self._moe.get(key)
        if found is None:
            ranks = rank_dies(self.dies[plan.instance], plan.moe)
            dispatch, combine = self.comm.moe(ranks, plan.moe.tokens_per_rank)
            found = self._moe[key] = StepResult(
                dispatch_s=dispatch,
                combine_s=combine,
                compute_share=self.shares.get(plan.instance, 1.0),
            )
        return found


def simulate(
    deployment: Deployment,
    requests: Iterable[Request],
    *,
    duration_s: float | None = None,
    profile: HardwareProfile = DEFAULT_PROFILE,
    topology: Topology | None = None,
    stream_tokens: bool = False,
    failures: Sequence[DieLoss] = (),
    slow: Sequence[SlowNpu] = (),
) -> Simulation:
    """Run `requests` (in arrival order) through the engine. With `duration_s` the run stops
    there (requests arriving later are not submitted; the report covers [0, duration_s]);
    without, it runs until every request has finished. `failures` isolate and restore NPUs;
    `slow` NPUs slow their instances' steps."""
    oracle = Oracle(
        deployment, topology or topology_for(deployment.preset, profile), profile, slow=slow
    )
    engine = Engine(deployment, profile=profile, stream_tokens=stream_tokens)
    recorder = Recorder()
    arrivals = iter(requests)
    pending = next(arrivals, None)
    end = float("inf") if duration_s is None else duration_s
    changes = _changes(failures, oracle, engine)
    now = 0.0
    while True:
        due = engine.next_due_time()
        t_arrival = pending.arrival_s if pending is not None else float("inf")
        t_change = changes[0][0] if changes else float("inf")
        now = min(t_arrival, t_change, due if due is not None else float("inf"))
        if now == float("inf") or now > end:
            break
        while changes and changes[0][0] <= now:
            heapq.heappop(changes)[2](now)
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


Change = tuple[float, int, Callable[[float], object]]


def _changes(failures: Sequence[DieLoss], oracle: Oracle, engine: Engine) -> list[Change]:
    """Each failure's isolation and restore as (instant, order, apply), a heap."""
    out: list[Change] = []
    per = oracle.npu_dies
    for k, f in enumerate(failures):
        npus = oracle.layout.get(f.instance)
        if npus is None or not 0 <= f.npu < len(npus):
            raise InvalidArgumentError(
                f"no NPU {f.npu} in instance {f.instance!r}", field="failures"
            )
        if f.restored_s is not None and f.restored_s < f.at_s:
            raise InvalidArgumentError("a die is restored before it is lost", field="failures")
        dies = range(f.npu * per, (f.npu + 1) * per)

        def lose(t: float, f: DieLoss = f, d: range = dies) -> None:
            engine.isolate(f.instance, d, t)

        out.append((f.at_s, 2 * k, lose))
        if f.restored_s is not None:

            def back(t: float, f: DieLoss = f, d: range = dies) -> None:
                if f.replacement is not None:
                    oracle.replace(f.instance, f.npu, f.replacement)
                engine.restore(f.instance, d, t)

            out.append((f.restored_s, 2 * k + 1, back))
    heapq.heapify(out)
    return out


def merge_sorted(*streams: Iterable[Request]) -> list[Request]:
    """Several request streams as one, in arrival order."""
    return list(heapq.merge(*streams, key=lambda r: r.arrival_s))
