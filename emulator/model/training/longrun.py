"""Model mode: a long training run (the published 40 days) with NPU failures drawn from an MTBF.

Event by event, not step by step, so that 40 days take milliseconds: failures of the job's NPUs
arrive as a Poisson process (`npus / mtbf` per second); between two, the job runs checkpoint
cycles (`checkpoint_every` steps, then a blocking checkpoint write). A failure loses the steps
since the last completed checkpoint, and the job waits for its recovery: detection (missed
heartbeats: up to `misses_to_fail` intervals), a spare (the pool of `spares` NPUs, each failed
NPU repaired back into it after `repair_s`; none free: wait for a repair), the hand-over, the
restart, and the reload of the checkpoint from EMS's SSD tier. Failures during a recovery are
folded into it (not drawn). The step time is the cost model's and the collectives' on the
topology's link graph; the checkpoint's write is timed at the UB rate into CPU memory (EMS's
pools), its reload from the SSD tier of every node (the worst case: spilled).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from cmemu.emulator.model.costmodel import NS, ems_ssd_ns
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.topology import DeviceKind, Topology, build
from cmemu.emulator.model.training.checkpoint import checkpoint_bytes
from cmemu.emulator.model.training.spec import shape_of
from cmemu.emulator.model.training.timing import ModelTimer, first_dies

DAY_S = 86_400.0
HOUR_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class RunParams:
    """Everything the event loop needs, in emulated seconds."""

    horizon_s: float
    npus: int
    mtbf_s: float  # per NPU
    step_s: float
    checkpoint_every: int
    checkpoint_write_s: float
    reload_s: float
    heartbeat_interval_s: float
    misses_to_fail: int
    replace_s: float
    restart_s: float
    spares: int
    repair_s: float
    recovery_target_s: float


@dataclass(frozen=True, kw_only=True)
class LongRunResult:
    params: RunParams
    failures: int
    steps: int  # kept at the end
    steps_lost: int
    goodput: float  # useful step time / elapsed
    recovery_s: tuple[float, ...]  # each failure's time from the fault to running again
    waited_for_spare: int  # failures that found no spare free
    young_daly_every: int  # the checkpoint interval (steps) that would minimise the waste

    @property
    def recovered_within_target(self) -> float:
        """Share of the recoveries within the published target (1.0 with none)."""
        if not self.recovery_s:
            return 1.0
        t = self.params.recovery_target_s
        return sum(r <= t for r in self.recovery_s) / len(self.recovery_s)

    def summary(self) -> dict[str, float | int]:
        r = sorted(self.recovery_s)
        p = self.params

        def pct(q: float) -> float:
            return r[min(len(r) - 1, math.ceil(q * len(r)) - 1)] if r else 0.0

        return {
            "days": p.horizon_s / DAY_S,
            "npus": p.npus,
            "mtbf_hours": p.mtbf_s / HOUR_S,
            "step_s": p.step_s,
            "checkpoint_every": p.checkpoint_every,
            "checkpoint_write_s": p.checkpoint_write_s,
            "reload_s": p.reload_s,
            "failures": self.failures,
            "steps": self.steps,
            "steps_lost": self.steps_lost,
            "goodput": self.goodput,
            "recovery_mean_s": statistics.fmean(r) if r else 0.0,
            "recovery_p50_s": pct(0.5),
            "recovery_p99_s": pct(0.99),
            "recovery_max_s": r[-1] if r else 0.0,
            "recovered_within_target": self.recovered_within_target,
            "recovery_target_s": p.recovery_target_s,
            "waited_for_spare": self.waited_for_spare,
            "young_daly_every": self.young_daly_every,
        }


def run(params: RunParams, seed: int = 0) -> LongRunResult:
    p = params
    rng = random.Random(seed)
    rate = p.npus / p.mtbf_s
    cycle_s = p.checkpoint_every * p.step_s + p.checkpoint_write_s
    spare_free_at = [0.0] * p.spares
    t = 0.0
    kept = lost = failures = waited = 0
    recoveries: list[float] = []
    while t < p.horizon_s:
        gap = rng.expovariate(rate)
        run_s = min(gap, p.horizon_s - t)
        cycles, rem = divmod(run_s, cycle_s)
        partial = min(p.checkpoint_every, int(rem / p.step_s))
        kept += int(cycles) * p.checkpoint_every
        t += run_s
        if gap >= p.horizon_s - (t - run_s):
            kept += partial  # the run ends: those steps are done, checkpointed or not
            break
        failures += 1
        lost += partial
        detect = (p.misses_to_fail - 1 + rng.random()) * p.heartbeat_interval_s
        wait = 0.0
        if spare_free_at:
            k = min(range(len(spare_free_at)), key=spare_free_at.__getitem__)
            wait = max(0.0, spare_free_at[k] - (t + detect))
            spare_free_at[k] = t + detect + wait + p.repair_s
        else:
            wait = p.repair_s  # no spare at all: the failed NPU itself comes back
        waited += wait > 0
        recovery = detect + wait + p.replace_s + p.restart_s + p.reload_s
        recoveries.append(recovery)
        t += recovery
    elapsed = min(t, p.horizon_s) if t else p.horizon_s
    job_mtbf = p.mtbf_s / p.npus
    young_daly = math.sqrt(2 * p.checkpoint_write_s * job_mtbf) / p.step_s
    return LongRunResult(
        params=p,
        failures=failures,
        steps=kept,
        steps_lost=lost,
        goodput=min(1.0, kept * p.step_s / max(elapsed, p.horizon_s)),
        recovery_s=tuple(recoveries),
        waited_for_spare=waited,
        young_daly_every=max(1, round(young_daly)),
    )


def simulate_training(
    *,
    days: float,
    mtbf_hours: float,
    npus: int,
    preset: str = "cm384",
    checkpoint_every: int = 0,
    expert_parallel: int = 0,
    spares: int | None = None,
    seed: int = 0,
    profile: HardwareProfile = DEFAULT_PROFILE,
    topology: Topology | None = None,
) -> LongRunResult:
    """The model-mode long run on `preset`: the step timed on its link graph, the checkpoint's
    write over the job's dies' UB and its reload from the SSD tier of every node. `spares`
    defaults to the scheduler's (spares_per_rack per rack)."""
    if not days > 0:
        raise InvalidArgumentError(f"days must be > 0, got {days}", field="days")
    if not mtbf_hours > 0:
        raise InvalidArgumentError(f"mtbf_hours must be > 0, got {mtbf_hours}", field="mtbf_hours")
    topo = topology or build(preset)
    total = sum(1 for d in topo.devices if d.kind is DeviceKind.NPU)
    if not 0 < npus <= total:
        raise InvalidArgumentError(
            f"npus must be 1..{total} on {topo.preset}, got {npus}", field="npus"
        )
    shape = shape_of(
        name="longrun",
        npus=npus,
        checkpoint_every=checkpoint_every,
        expert_parallel=expert_parallel,
        profile=profile,
    )
    step = ModelTimer(topo, profile).step(shape, first_dies(topo, npus, profile))
    size = checkpoint_bytes(shape, profile)
    # every die writes its share into the pools' CPU DRAM over UB at the measured NPU -> CPU
    # memory write rate; EMS spills it to its SSD tier afterwards, off the job's critical path
    write_s = size / (shape.dies * profile.ub.cpu_memory_write_bytes_per_s)
    nodes = len(topo.nodes)
    reload_s = ems_ssd_ns(math.ceil(size / nodes), profile) / NS
    racks = math.ceil(nodes / profile.node.nodes_per_rack)
    m, t = profile.manager, profile.training
    params = RunParams(
        horizon_s=days * DAY_S,
        npus=npus,
        mtbf_s=mtbf_hours * HOUR_S,
        step_s=step.total_s,
        checkpoint_every=shape.checkpoint_every,
        checkpoint_write_s=write_s,
        reload_s=reload_s,
        heartbeat_interval_s=m.heartbeat_interval_s,
        misses_to_fail=m.misses_to_fail,
        replace_s=t.replace_s,
        restart_s=t.restart_s,
        spares=profile.scheduler.spares_per_rack * racks if spares is None else spares,
        repair_s=t.repair_s,
        recovery_target_s=m.recovery_target_s,
    )
    return run(params, seed)
