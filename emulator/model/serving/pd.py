"""Dynamic PD in model mode (issue 24 item 4): a deployment's NPUs as interchangeable units that a
policy (pdpolicy.py) moves between prefill and decode as the prompt/output mix and the load
change, a workload run through them, and what it bought: the P:D split over time, every switch,
and goodput (requests meeting both the TTFT and the TPOT target, per second).

A queueing simulation on the units' cost-model figures, deterministic, event by event:
- prefill units take requests first come first served, each for its prompt's share of a
  prefill batch of such prompts; its first token is out when that ends (the KV transfer to decode
  is not timed here: the full engine in des.py times it);
- decode units pool their slots; a prefilled request waits for room (which stretches its TPOT:
  its second token comes only then), then holds its share of a unit (one slot of the batch the
  operating point allows at its context) for output x that point's TPOT;
- a unit changing role leaves its role at once for new work, finishes what it holds (a prefill
  unit its prompt, decode units until the others' slots can hold what is left), then reloads the
  weights from EMS and joins its new role.

Not modelled (said so in README): a decode unit is one instance of the unit's size at its own
operating point (the paper's EP320 decode instance would be faster per NPU, and is not split
into units); KV migration (a decode unit drains instead); the live router (model mode only).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.deployment import Deployment
from cmemu.emulator.model.serving.pdpolicy import (
    DemandMeter,
    PdOptions,
    UnitRates,
    check_options,
    next_move,
    unit_rates,
)
from cmemu.emulator.model.serving.plans import Request


@dataclass(frozen=True)
class Sample:
    """The split at a decision, and the mix the policy measured then."""

    at_s: float
    prefill: int  # units in each role (switching ones in neither)
    decode: int
    switching: int
    prefill_share: float  # of the demand, in unit-seconds: what the split should follow


@dataclass(frozen=True)
class PdSwitch:
    at_s: float
    to: str  # "prefill" or "decode"
    units: int
    ready_s: float = 0.0  # when the last of them joined (0: still switching at the end)


@dataclass(kw_only=True)
class PdResult:
    policy: str
    units: int
    unit_npus: int
    load_s: float
    duration_s: float
    submitted: int = 0
    finished: int = 0
    good: int = 0  # met both targets
    good_tokens: int = 0
    trace: list[Sample] = field(default_factory=list)
    switches: list[PdSwitch] = field(default_factory=list)

    @property
    def goodput_per_s(self) -> float:
        return self.good / self.duration_s

    @property
    def goodput_tokens_per_s(self) -> float:
        return self.good_tokens / self.duration_s

    @property
    def slo_attainment(self) -> float:
        return self.good / self.submitted if self.submitted else 1.0

    def to_dict(self) -> dict[str, object]:
        doc = asdict(self)
        doc |= {
            "goodput_per_s": self.goodput_per_s,
            "goodput_tokens_per_s": self.goodput_tokens_per_s,
            "slo_attainment": self.slo_attainment,
        }
        return doc


class _Ev(IntEnum):  # at one instant: units join, work ends, then the policy decides
    READY = 0
    PREFILLED = 1
    DECODED = 2
    DECIDE = 3


def simulate_pd(
    requests: Sequence[Request],
    rates: UnitRates,
    options: PdOptions,
    *,
    duration_s: float,
    ttft_target_s: float,
    tpot_target_s: float,
    default_prefill_units: int,
) -> PdResult:
    """Run `requests` (in arrival order, those before `duration_s`) through the units under
    `options.policy` (module docstring); goodput over `duration_s`."""
    check_options(options, rates.units)
    return _Run(
        rates, options, duration_s, (ttft_target_s, tpot_target_s), default_prefill_units
    ).run([r for r in requests if r.arrival_s < duration_s])


class _Run:
    def __init__(
        self,
        rates: UnitRates,
        o: PdOptions,
        duration_s: float,
        targets: tuple[float, float],
        default_p: int,
    ) -> None:
        self.r, self.o, self.end, self.targets = rates, o, duration_s, targets
        p = o.prefill_units or min(max(1, default_p), rates.units - 1)
        self.result = PdResult(
            policy=o.policy,
            units=rates.units,
            unit_npus=rates.npus,
            load_s=rates.load_s,
            duration_s=duration_s,
        )
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, order, subject)
        self.order = 0
        self.idle_prefill = p  # prefill units free for a prompt
        self.prefill_units, self.decode_units = p, rates.units - p
        self.leaving_prefill = 0  # busy prefill units that switch once their prompt ends
        self.draining = 0  # decode units that switch once the others can hold the rest
        self.switching = 0  # units reloading
        self.unlaunched: deque[int] = deque()  # a switch's units not reloading yet: its index
        self.queue: deque[int] = deque()  # prompts waiting for a prefill unit
        self.waiting: deque[int] = deque()  # prefilled, waiting for a decode slot
        self.held = 0.0  # decode units' worth of slots held
        self.first: dict[int, float] = {}  # first token times
        self.work: dict[int, tuple[float, float, float]] = {}  # prefill s, decode share, hold s
        self.meter = DemandMeter(o)

    def push(self, t: float, kind: _Ev, subject: int = 0) -> None:
        self.order += 1
        heapq.heappush(self.events, (t, int(kind), self.order, subject))

    def run(self, requests: list[Request]) -> PdResult:
        self.reqs = requests
        self.result.submitted = len(requests)
        self.push(0.0, _Ev.DECIDE)
        nxt = 0
        while True:
            t_arrival = requests[nxt].arrival_s if nxt < len(requests) else float("inf")
            if self.events and self.events[0][0] <= t_arrival:
                t, kind, _, subject = heapq.heappop(self.events)
                if t > self.end:
                    break
                self._event(t, _Ev(kind), subject)
            elif nxt < len(requests):
                self._arrive(t_arrival, nxt)
                nxt += 1
            else:
                break
        return self.result

    def _event(self, t: float, kind: _Ev, subject: int) -> None:
        if kind is _Ev.READY:
            self._ready(t, subject)
        elif kind is _Ev.PREFILLED:
            self._prefilled(t, subject)
        elif kind is _Ev.DECODED:
            self._decoded(t, subject)
        else:
            self._decide(t)
            self.push(t + self.o.interval_s, _Ev.DECIDE)

    # --- requests ---------------------------------------------------------------------------

    def _arrive(self, t: float, i: int) -> None:
        req = self.reqs[i]
        share, hold = self.r.decode(req.input_tokens, req.output_tokens)
        self.work[i] = (self.r.prefill_s(req.input_tokens), share, hold)
        self.meter.arrive(t, self.work[i][0], share * hold)
        self.queue.append(i)
        self._start_prefills(t)

    def _start_prefills(self, t: float) -> None:
        while self.queue and self.idle_prefill > 0:
            i = self.queue.popleft()
            self.idle_prefill -= 1
            self.push(t + self.work[i][0], _Ev.PREFILLED, i)

    def _prefilled(self, t: float, i: int) -> None:
        self.first[i] = t
        if self.leaving_prefill:  # this unit was asked to switch: it goes now
            self.leaving_prefill -= 1
            self._launch(t)
        else:
            self.idle_prefill += 1
        self.waiting.append(i)
        self._start_prefills(t)
        self._start_decodes(t)

    def _start_decodes(self, t: float) -> None:
        while self.waiting:
            _, share, hold = self.work[self.waiting[0]]
            if self.held + share > self.decode_units * (1 + 1e-9):
                break
            i = self.waiting.popleft()
            self.held += share
            self.push(t + hold, _Ev.DECODED, i)

    def _decoded(self, t: float, i: int) -> None:
        req = self.reqs[i]
        self.held = max(0.0, self.held - self.work.pop(i)[1])
        first = self.first.pop(i)
        ttft = first - req.arrival_s
        tpot = (t - first) / (req.output_tokens - 1) if req.output_tokens > 1 else 0.0
        if t <= self.end:
            self.result.finished += 1
            if ttft <= self.targets[0] and tpot <= self.targets[1] * (1 + 1e-9):
                self.result.good += 1
                self.result.good_tokens += req.output_tokens
        self._release_drained(t)
        self._start_decodes(t)

    # --- switching ---------------------------------------------------------------------------

    def _launch(self, t: float) -> None:
        """The next unit of a switch starts reloading the weights for its new role."""
        k = self.unlaunched.popleft()
        self.switching += 1
        self.push(t + self.r.load_s, _Ev.READY, k)

    def _release_drained(self, t: float) -> None:
        """Draining decode units go once the units staying can hold what is left."""
        while self.draining and self.held <= self.decode_units * (1 + 1e-9):
            self.draining -= 1
            self._launch(t)

    def _ready(self, t: float, k: int) -> None:
        self.switching -= 1
        switch = self.result.switches[k]
        if switch.to == "prefill":
            self.prefill_units += 1
            self.idle_prefill += 1
            self._start_prefills(t)
        else:
            self.decode_units += 1
            self._start_decodes(t)
        self.result.switches[k] = PdSwitch(switch.at_s, switch.to, switch.units, t)

    def _decide(self, t: float) -> None:
        waiting_prefill = sum(self.work[i][0] for i in self.queue)
        waiting_slots = sum(self.work[i][1] * self.work[i][2] for i in self.waiting)
        demand = self.meter.demand(t, waiting_prefill, waiting_slots)
        p, d = self.prefill_units, self.decode_units
        self.result.trace.append(Sample(t, p, d, self.switching, demand.prefill_share))
        if self.draining or self.leaving_prefill or not self.meter.recent:
            return  # units still finishing their old role's work, or nothing measured yet
        going = self.result.switches[-1].to if self.switching else ""
        move = next_move(
            p,
            self.r.units,
            going=going,
            switching=self.switching,
            demand=demand,
            o=self.o,
            load_s=self.r.load_s,
        )
        if move is None:
            return
        to, moving = move
        self.result.switches.append(PdSwitch(t, to, moving))
        self.unlaunched.extend([len(self.result.switches) - 1] * moving)
        if to == "decode":
            self.prefill_units -= moving
            idle = min(moving, self.idle_prefill)
            self.idle_prefill -= idle
            self.leaving_prefill += moving - idle
            for _ in range(idle):
                self._launch(t)
        else:
            self.decode_units -= moving
            self.draining += moving
            self._release_drained(t)


def run_pd(
    deployment: Deployment,
    requests: Sequence[Request],
    options: PdOptions,
    *,
    duration_s: float,
    profile: HardwareProfile = DEFAULT_PROFILE,
    rates: UnitRates | None = None,
) -> PdResult:
    """`simulate_pd` on `deployment`'s units, its SLO targets, and its own prefill share as
    the split to start from (unless `options.prefill_units` says). `rates`: the deployment's
    units on `profile`, when the caller has them already (several runs share them)."""
    if not duration_s > 0:
        raise InvalidArgumentError(f"duration must be > 0, got {duration_s}", field="duration")
    rates = rates or unit_rates(deployment, profile=profile)
    share = deployment.prefill.instances * deployment.prefill.npus / deployment.npus
    return simulate_pd(
        requests,
        rates,
        options,
        duration_s=duration_s,
        ttft_target_s=deployment.prefill.ttft_target_s,
        tpot_target_s=deployment.decode.tpot_target_s,
        default_prefill_units=round(share * rates.units),
    )
