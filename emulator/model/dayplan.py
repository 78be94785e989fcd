"""Serve by day, train by night (issue 24 item 5), in model mode: one day of a supernode whose
NPUs serve a Tokens service while its demand is high and train a model while it is low.

Demand follows a diurnal curve (a cosine between a trough and a peak, in output tokens per
second). Serving capacity is the deployment's own SLO operating point (operating.py: the
largest decode batch whose TPOT meets the target), as output tokens per second per NPU of the
deployment (prefill NPUs included), on whole groups of `unit_npus` NPUs. A training job takes
the NPUs serving does not need, in the same units, and runs DeepSeek-V3 steps timed by the
training model (training/timing.py, on the topology's link graph); its tokens per step grow
with its dies (data parallel).

Switching costs what the machine pays for it, from the profile: NPUs going to training first
drain their requests (the mean output length at the TPOT target), then the job restarts
(`training.restart_s`) and, after its first run, reloads its checkpoint from EMS's SSD tier;
NPUs coming back to serving wait for the job's checkpoint write (its dies' UB rate into the
pools) and then load the model's weights from EMS (`serving.cache_from_ems_s`). A resize of the
job is a stop and a start. Policies: `serve-only` (the baseline), `calendar` (serving shrinks
to the night's peak demand inside a night window), `load` (every interval, serving keeps the
demand it will have when a switch back would complete, plus headroom; the rest trains).

Not modelled (said so in README): a smaller serving footprint keeps the deployment's per-NPU
rate (reconfiguring EP320 into smaller instances changes it), and demand above capacity is
counted as unserved rather than queued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.costmodel import NS, ems_ssd_ns
from cmemu.emulator.model.daywindow import in_window
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.deployment import Deployment
from cmemu.emulator.model.serving.operating import operating_point
from cmemu.emulator.model.topology import DeviceKind, Topology, build
from cmemu.emulator.model.training.checkpoint import checkpoint_bytes
from cmemu.emulator.model.training.spec import shape_of
from cmemu.emulator.model.training.timing import ModelTimer, first_dies

DAY_S = 86_400.0
POLICIES = ("serve-only", "calendar", "load")


@dataclass(frozen=True, kw_only=True)
class DayParams:
    peak_tokens_per_s: float  # demand at the peak hour, output tokens per second
    tokens_per_s_per_npu: float  # serving capacity per NPU at the SLO (the operating point)
    drain_s: float  # a serving NPU's in-flight requests finish (output length x TPOT)
    trough_fraction: float = 0.2  # demand at the trough, as a fraction of the peak
    peak_hour: float = 14.0
    policy: str = "load"
    night: tuple[float, float] = (22.0, 7.0)  # the calendar policy's window, hours
    headroom: float = 0.2  # serving capacity kept above the demand
    unit_npus: int = 16  # serving and training move in whole nodes
    interval_s: float = 900.0  # how often the load policy decides
    dt_s: float = 60.0  # the day is integrated in steps of this much emulated time


@dataclass(frozen=True, kw_only=True)
class Switch:
    at_s: float
    to: str  # "training" or "serving"
    npus: int
    duration_s: float  # until the NPUs do their new work


@dataclass(kw_only=True)
class Hour:
    hour: int
    demand_tokens: float = 0.0
    served_tokens: float = 0.0
    serving_npus: float = 0.0  # mean over the hour
    training_npus: float = 0.0
    switching_npus: float = 0.0
    training_steps: float = 0.0


@dataclass(kw_only=True)
class DayResult:
    policy: str
    npus: int
    hours: list[Hour]
    switches: list[Switch] = field(default_factory=list)
    training_tokens: float = 0.0

    @property
    def demand_tokens(self) -> float:
        return sum(h.demand_tokens for h in self.hours)

    @property
    def served_tokens(self) -> float:
        return sum(h.served_tokens for h in self.hours)

    @property
    def served_fraction(self) -> float:
        return self.served_tokens / self.demand_tokens if self.demand_tokens else 1.0

    @property
    def training_steps(self) -> float:
        return sum(h.training_steps for h in self.hours)

    @property
    def training_npu_hours(self) -> float:
        return sum(h.training_npus for h in self.hours)

    def to_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "npus": self.npus,
            "demand_tokens": self.demand_tokens,
            "served_tokens": self.served_tokens,
            "served_fraction": self.served_fraction,
            "training_steps": self.training_steps,
            "training_tokens": self.training_tokens,
            "training_npu_hours": self.training_npu_hours,
            "switches": [s.__dict__ for s in self.switches],
            "hours": [h.__dict__ for h in self.hours],
        }


def params_for(
    deployment: Deployment,
    *,
    peak_tokens_per_s: float,
    prompt_tokens: float,
    output_tokens: float,
    target_tpot_s: float | None = None,
    profile: HardwareProfile = DEFAULT_PROFILE,
    **changes: Any,
) -> DayParams:
    """The day's serving figures from `deployment`'s SLO operating point: output tokens per
    second per NPU of the deployment (prefill NPUs included), and a drain of one request's
    output at that TPOT."""
    point = operating_point(
        deployment,
        target_tpot_s or deployment.decode.tpot_target_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        profile=profile,
    )
    decode_npus = deployment.decode.instances * deployment.decode.npus
    return DayParams(
        peak_tokens_per_s=peak_tokens_per_s,
        tokens_per_s_per_npu=point.tokens_per_s_per_npu * decode_npus / deployment.npus,
        drain_s=output_tokens * point.tpot_s,
        **changes,
    )


def demand(at_s: float, p: DayParams) -> float:
    """Output tokens per second wanted at `at_s` into the day: a cosine, highest at the peak
    hour, lowest twelve hours away."""
    phase = 2 * math.pi * ((at_s / 3600.0 - p.peak_hour) / 24.0)
    return p.peak_tokens_per_s * (
        p.trough_fraction + (1 - p.trough_fraction) * (1 + math.cos(phase)) / 2
    )


class Trainer:
    """The training job's figures at each size it may run at (step, tokens, checkpoint)."""

    def __init__(self, topology: Topology, profile: HardwareProfile) -> None:
        self.topology = topology
        self.profile = profile
        self.timer = ModelTimer(topology, profile)  # its collective timings shared by sizes
        self._cache: dict[int, tuple[float, float, float, float]] = {}

    def figures(self, npus: int) -> tuple[float, float, float, float]:
        """(step s, tokens per step, checkpoint write s, checkpoint reload s) on `npus`."""
        if npus not in self._cache:
            p, topo = self.profile, self.topology
            shape = shape_of(name="night", npus=npus, profile=p)
            step = self.timer.step(shape, first_dies(topo, npus, p))
            tokens = shape.dies * shape.micro_batches * p.training.tokens_per_die
            size = checkpoint_bytes(shape, p)
            write_s = size / (shape.dies * p.ub.cpu_memory_write_bytes_per_s)
            reload_s = ems_ssd_ns(math.ceil(size / len(topo.nodes)), p) / NS
            self._cache[npus] = (step.total_s, tokens, write_s, reload_s)
        return self._cache[npus]


def serving_target(at_s: float, p: DayParams, total: int, back_s: float) -> int:
    """The NPUs serving keeps at `at_s` under the policy (the rest may train): whole units
    covering the demand plus headroom, over the time a switch back would take (load), or over
    the whole night window (calendar)."""
    if p.policy == "serve-only":
        return total
    if p.policy == "calendar":
        if not in_window(at_s, p.night):
            return total
        rate, k = 0.0, 0  # the peak of what is left of this night
        while k * p.dt_s < DAY_S and in_window(at_s + k * p.dt_s, p.night):
            rate, k = max(rate, demand(at_s + k * p.dt_s, p)), k + 1
    else:
        rate = max(demand(at_s + k * p.dt_s, p) for k in range(int(back_s / p.dt_s) + 2))
    wanted = rate * (1 + p.headroom) / p.tokens_per_s_per_npu
    return min(total, math.ceil(wanted / p.unit_npus - 1e-9) * p.unit_npus)


def simulate_day(
    p: DayParams,
    *,
    preset: str = "cm384",
    profile: HardwareProfile = DEFAULT_PROFILE,
    topology: Topology | None = None,
) -> DayResult:
    if p.policy not in POLICIES:
        raise InvalidArgumentError(
            f"policy must be one of {', '.join(POLICIES)}, got {p.policy!r}", field="policy"
        )
    for name in ("peak_tokens_per_s", "tokens_per_s_per_npu", "interval_s", "dt_s"):
        if not getattr(p, name) > 0:
            raise InvalidArgumentError(f"{name} must be > 0", field=name)
    if not 0 <= p.trough_fraction <= 1:
        raise InvalidArgumentError("trough_fraction must be within 0..1", field="trough_fraction")
    topo = topology or build(preset)
    total = sum(1 for d in topo.devices if d.kind is DeviceKind.NPU)
    if p.unit_npus <= 0 or total % p.unit_npus:
        raise InvalidArgumentError(
            f"unit_npus must divide the {total} NPUs of {topo.preset}", field="unit_npus"
        )
    return _Day(p, total, Trainer(topo, profile), profile).run()


class _Day:
    """The day, integrated every `dt_s`: who does what, and the switches under way."""

    def __init__(self, p: DayParams, total: int, trainer: Trainer, profile: HardwareProfile):
        self.p, self.total, self.trainer, self.profile = p, total, trainer, profile
        self.result = DayResult(
            policy=p.policy, npus=total, hours=[Hour(hour=h) for h in range(24)]
        )
        self.serving, self.training = total, 0  # NPUs doing each now
        self.returning: list[tuple[float, int]] = []  # (serving from, npus) on their way back
        self.job_ready_s = 0.0  # the job steps from here (after a (re)start)
        self.started = False

    def run(self) -> DayResult:
        p, t, next_decision = self.p, 0.0, 0.0
        while t < DAY_S - 1e-9:
            for ready, npus in [x for x in self.returning if x[0] <= t]:
                self.returning.remove((ready, npus))
                self.serving += npus
            if t >= next_decision - 1e-9 and not self.returning:
                self._decide(t)
                next_decision = t + p.interval_s
            self._account(t)
            t += p.dt_s
        return self.result

    def _write_s(self) -> float:
        return self.trainer.figures(self.training)[2] if self.training else 0.0

    def _decide(self, t: float) -> None:
        load_s = self.profile.serving.cache_from_ems_s
        want = serving_target(t, self.p, self.total, self._write_s() + load_s)
        restart_s = self.profile.training.restart_s
        if want > self.serving and self.training:  # give back: checkpoint, load the weights
            moved = min(want - self.serving, self.training)
            write_s = self._write_s()
            self.returning.append((t + write_s + load_s, moved))
            self._switch(t, "serving", moved, write_s + load_s)
            self.training -= moved
            if self.training:  # the job goes on, smaller: a restart from its checkpoint
                reload_s = self.trainer.figures(self.training)[3]
                self.job_ready_s = t + write_s + restart_s + reload_s
        elif want < self.serving:  # lend: drain, then the job (re)starts bigger
            moved = self.serving - want
            write_s = self._write_s()
            self.serving, self.training = want, self.training + moved
            reload_s = self.trainer.figures(self.training)[3] if self.started else 0.0
            duration = max(self.p.drain_s, write_s) + restart_s + reload_s
            self._switch(t, "training", moved, duration)
            self.job_ready_s, self.started = t + duration, True

    def _switch(self, t: float, to: str, npus: int, duration_s: float) -> None:
        self.result.switches.append(Switch(at_s=t, to=to, npus=npus, duration_s=duration_s))

    def _account(self, t: float) -> None:
        p, hour = self.p, self.result.hours[int(t // 3600)]
        wanted = demand(t, p) * p.dt_s
        hour.demand_tokens += wanted
        hour.served_tokens += min(wanted, self.serving * p.tokens_per_s_per_npu * p.dt_s)
        share = p.dt_s / 3600  # of the hour: the NPU counts are hourly means
        hour.serving_npus += self.serving * share
        hour.switching_npus += sum(n for _, n in self.returning) * share
        if self.training:
            step_s, tokens, _, _ = self.trainer.figures(self.training)
            busy = max(0.0, min(p.dt_s, t + p.dt_s - self.job_ready_s))
            hour.training_npus += self.training * share
            hour.training_steps += busy / step_s
            self.result.training_tokens += busy / step_s * tokens
