"""Flow-level timing: max-min fair sharing of trunks among flows, recomputed as flows come and go.

One algorithm serves both uses:
- `simulate` times a batch of flows that start together (a collective phase, or model mode);
- `LiveFlows` keeps the flows of a running fabric and is advanced by the emulated clock.

Each flow crosses some resources (trunks), each at a share (a memory pool's traffic is split over
its CPUs), and has its own ceiling (its usable UB planes). Rates are the weighted max-min fair
allocation, found by progressive filling: raise every unfrozen flow's rate together until a
resource or a flow's ceiling saturates, freeze the flows it holds, repeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.fairshare import (
    REL_TOL,
    Crossings,
    Incidences,
    fill,
    maxmin_rates,
    weighted_sum,
)
from cmemu.emulator.model.scratch import scratch

__all__ = [  # and, from fairshare.py, the max-min solver flowsim's users have always imported here
    "SIM_REL_TOL",
    "BatchResult",
    "FlowBatch",
    "LiveFlows",
    "maxmin_rates",
    "simulate",
    "weighted_sum",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
SIM_REL_TOL = 1e-2  # simulate's batching of completions: see simulate
Incidence = tuple[tuple[int, float], ...]  # a flow's (resource, share) pairs
RATES_MAX = 4096  # alone rates remembered (LiveFlows._rates); past it, the memory starts over
TIME_EPS_S = 1e-12  # below this a remainder is float noise: emulated time cannot even resolve it


class FlowBatch:
    """Flows in columnar form: per flow its bytes, ceiling and latency, and what it crosses, as
    incidences (flow, resource, share) or as Crossings, each derived from the other when first
    asked for (simulate works on Crossings; collectives.DieFlows builds them directly)."""

    def __init__(  # noqa: PLR0917 - positional, as when it was a dataclass (its callers)
        self,
        inc_flow: IntArray,
        inc_res: IntArray,
        inc_w: FloatArray,
        flow_cap: FloatArray,
        nbytes: FloatArray,
        latency_s: FloatArray,
    ) -> None:
        self._inc: Incidences | None = (inc_flow, inc_res, inc_w)
        self._crossings: Crossings | None = None
        self.flow_cap, self.nbytes, self.latency_s = flow_cap, nbytes, latency_s

    @classmethod
    def crossing(
        cls,
        crossings: Crossings,
        *,
        flow_cap: FloatArray,
        nbytes: FloatArray,
        latency_s: FloatArray,
    ) -> FlowBatch:
        batch = cls.__new__(cls)
        batch._inc, batch._crossings = None, crossings
        batch.flow_cap, batch.nbytes, batch.latency_s = flow_cap, nbytes, latency_s
        return batch

    @property
    def size(self) -> int:
        return len(self.nbytes)

    @property
    def matrix(self) -> Crossings:
        if self._crossings is None:
            assert self._inc is not None  # one of the two is always given
            self._crossings = Crossings.of(*self._inc, self.size)
        return self._crossings

    @property
    def incidences(self) -> Incidences:
        if self._inc is None:
            self._inc = self.matrix.incidences()
        return self._inc

    @property
    def inc_flow(self) -> IntArray:
        return self.incidences[0]

    @property
    def inc_res(self) -> IntArray:
        return self.incidences[1]

    @property
    def inc_w(self) -> FloatArray:
        return self.incidences[2]


@dataclass
class BatchResult:
    fluid_end_s: FloatArray  # when each flow's last byte left its bottleneck
    complete_s: FloatArray  # plus its path latency
    res_bytes: FloatArray  # bytes each resource carried
    events: int  # completion instants processed (each a batch of completions)
    recomputations: int = 0  # max-min rate computations (what the CPU time is proportional to)


def simulate(batch: FlowBatch, res_cap: FloatArray, *, rel_tol: float = SIM_REL_TOL) -> BatchResult:
    """Time flows that all start at 0, with rates recomputed as flows complete.

    Exact progressive filling recomputes the rates at every completion: with distinct sizes that
    is one max-min computation per flow, quadratic in the flows. Instead, completions are taken in
    batches: from the earliest completion t1 (elapsed time since 0), every flow that completes,
    at the current rates, by t1 * (1 + rel_tol) finishes at its own instant under those rates,
    and the rates are recomputed once, at the last of them. So the rates of the other flows lag
    the exact ones by at most rel_tol of the elapsed time; while rates only rise (flows leave and
    free capacity), a flow's completion time is late by at most rel_tol relatively
    (first order: its lost bytes are at most its final rate times rel_tol of its completion time),
    and a batch never ends early. The windows grow geometrically with time, so the number of
    recomputations is about ln(t_last / t_first) / rel_tol, whatever the number of flows.
    rel_tol=0 is the exact computation (completions within 1e-9 taken together).

    Also: a completion that releases no saturated resource crossed by a remaining flow leaves
    the allocation unchanged and costs no recomputation.
    """
    run = _Run(batch, res_cap, rel_tol)
    stale = True
    while not run.done.all():
        np.logical_not(run.done, out=run.active)
        if stale:
            run.recompute()
        run.complete_next()
        if run.done.all():
            break
        stale = run.rates_change()
    flows = run.flows
    return BatchResult(
        fluid_end_s=run.fluid_end,
        complete_s=run.fluid_end + batch.latency_s,
        res_bytes=flows.spread(flows.carried(batch.nbytes), len(res_cap)),
        events=run.events,
        recomputations=run.recomputations,
    )


class _Run:
    """simulate's state over one batch. Its arrays as long as the batch are this thread's work
    buffers (scratch.py), written in place (an EP320 dispatch otherwise spends more time
    faulting in the pages of fresh temporaries than computing); none of them leaves simulate,
    except fluid_end (a fresh array)."""

    def __init__(self, batch: FlowBatch, res_cap: FloatArray, rel_tol: float) -> None:
        n, self.batch, self.rel_tol = batch.size, batch, rel_tol
        self.flows = batch.matrix.solvable(len(res_cap))
        self.cap = self.flows.caps(res_cap)  # of the resources crossed, renumbered: Solvable
        self.remaining = scratch("simulate.remaining", (n,), np.float64)
        np.copyto(self.remaining, batch.nbytes)
        self.rates = (
            scratch("simulate.rate0", (n,), np.float64),
            scratch("simulate.rate1", (n,), np.float64),
        )
        self.lag = scratch("simulate.lag", (n,), np.float64)
        self.work = scratch("simulate.work", (n,), np.float64)
        self.finish_in = scratch("simulate.finish_in", (n,), np.float64)
        self.done = np.less_equal(self.remaining, 0, out=scratch("simulate.done", (n,), np.bool_))
        self.active = scratch("simulate.active", (n,), np.bool_)  # not done: simulate sets it
        self.finishing = scratch("simulate.finishing", (n,), np.bool_)
        self.mask = scratch("simulate.mask", (n,), np.bool_)
        self.fluid_end = np.zeros(n)
        self.now = 0.0
        self.rate = self.old_rate = self.rates[0]  # (read only once computed)
        self.saturated = np.zeros(len(self.cap), dtype=bool)
        self.events = self.recomputations = 0

    def recompute(self) -> None:
        """The max-min rates of the active flows, into the rate buffer old_rate does not hold."""
        self.recomputations += 1
        out = self.rates[self.recomputations % 2]
        rate, residual = fill(self.flows, self.cap, self.batch.flow_cap, self.active, out=out)
        no_rate = np.less_equal(rate, 0, out=self.mask)
        if np.logical_and(no_rate, self.active, out=self.mask).any():
            raise UnavailableError("some flows have no bandwidth left on their route")
        self.saturated = residual <= 1e-6 * self.cap
        self.saturated[-1] = False  # (the padding)
        # The batch's completions changed these rates at their mean instant, not at its end:
        # credit (or debit) the survivors with the difference since then.
        if self.events:  # (the first computation has no batch behind it)
            work, remaining = self.work, self.remaining
            np.multiply(np.subtract(rate, self.old_rate, out=work), self.lag, out=work)
            np.maximum(np.subtract(remaining, work, out=remaining), 0.0, out=remaining)
        self.rate = rate

    def complete_next(self) -> None:
        """Finish the next batch of completions (see simulate) at the present rates."""
        active, finishing = self.active, self.finishing
        finish_in, remaining = self.finish_in, self.remaining
        finish_in.fill(np.inf)
        np.divide(remaining, self.rate, out=finish_in, where=active)
        first = float(finish_in.min())
        horizon = first * (1 + REL_TOL) + self.rel_tol * (self.now + first)
        np.logical_and(active, np.less_equal(finish_in, horizon, out=finishing), out=finishing)
        times = scratch("simulate.times", (int(np.count_nonzero(finishing)),), np.float64)
        ending = np.compress(finishing, finish_in, out=times)
        step = float(ending.max())
        np.add(finish_in, self.now, out=self.fluid_end, where=finishing)
        self.lag.fill(0.0)
        waiting = np.logical_and(active, np.logical_not(finishing, out=self.mask), out=self.mask)
        np.copyto(self.lag, step - float(ending.mean()), where=waiting)
        self.old_rate = self.rate
        self.now += step
        moved = np.multiply(self.rate, step, out=self.work)
        np.subtract(remaining, moved, out=remaining, where=active)
        np.copyto(remaining, 0.0, where=finishing)
        self.done |= finishing
        self.events += 1

    def rates_change(self) -> bool:
        """Rates change only if the flows just finished released a saturated resource that a
        remaining flow crosses; otherwise the max-min allocation of the others is the same."""
        rows, finishing = self.flows.rows, self.finishing
        released = np.zeros(len(self.cap), dtype=bool)
        ended = scratch(
            "simulate.rows", (rows.shape[0], int(np.count_nonzero(finishing))), np.int64
        )
        released[np.compress(finishing, rows, axis=1, out=ended)] = True
        released &= self.saturated
        if not released.any():
            return False
        hit = scratch("simulate.hit", rows.shape, np.bool_)
        crossing = np.logical_or.reduce(np.take(released, rows, out=hit, mode="clip"), axis=0)
        remains = np.logical_not(self.done, out=self.mask)
        return bool(np.logical_and(crossing, remains, out=self.mask).any())


@dataclass
class _Flow:
    resources: tuple[tuple[int, float], ...]
    cap: float
    nbytes: float
    remaining: float
    rate: float = 0.0

    def done(self, now_s: float) -> bool:
        """Finished, up to float noise: what is left is a rounding of its size, or would take
        less time than the clock can resolve at `now_s` (late in a run one step of a float
        clock exceeds TIME_EPS_S: a remainder below it must finish, or time stands still)."""
        resolution = max(TIME_EPS_S, 4 * math.ulp(now_s))
        return self.remaining <= REL_TOL * self.nbytes or (
            self.rate > 0 and self.remaining / self.rate <= resolution
        )


_NO_RESOURCES: IntArray = np.zeros(0, dtype=np.int64)


@dataclass
class LiveFlows:
    """The flows in flight in a running fabric, advanced by emulated time (seconds).

    Not thread-safe and not async: the fabric calls it from its event loop only.
    """

    res_cap: FloatArray
    now_s: float = 0.0
    flows: dict[int, _Flow] = field(default_factory=dict)
    res_bytes: FloatArray = field(init=False)
    res_rate: FloatArray = field(init=False)
    completed: int = 0
    # the fluid end of the last flow answered alone across shared resources (`take_alone`): a
    # flow that starts before it would have overlapped that one, and is run (add), not answered
    quiet_until: float = 0.0
    _next_id: int = 0
    # a flow alone's rate per route (its resources' identity: routes are cached), until the
    # capacities change: take_alone answers a stream of transactions with one lookup each
    _rates: dict[int, tuple[Incidence, float, float]] = field(default_factory=dict)
    # the resources the flows in flight cross (where res_rate may be non-zero): a fabric has
    # thousands of trunks (cm384: 12,672 links) and a UB transaction crosses a handful, so the
    # rates are computed and the bytes counted over these only, never over every trunk
    _busy: IntArray = field(init=False)

    def __post_init__(self) -> None:
        self.res_bytes = np.zeros(len(self.res_cap))
        self.res_rate = np.zeros(len(self.res_cap))
        self._busy = np.zeros(0, dtype=np.int64)

    def add(
        self, start_s: float, resources: tuple[tuple[int, float], ...], cap: float, nbytes: float
    ) -> tuple[int, list[tuple[int, float]]]:
        """Start a flow at max(start_s, now); returns its id and the flows that finished first.

        An idle fabric starts the flow at start_s even if it was advanced past it meanwhile (its
        issuer stamped it earlier than it arrived): nothing was in flight to be re-timed."""
        if not resources and not math.isfinite(cap):
            raise UnavailableError("a flow crosses no resource and has no ceiling")
        if not self.flows and start_s < self.now_s:
            self.now_s = start_s
        finished = self.advance(start_s)
        flow_id = self._next_id
        self._next_id += 1
        flow = _Flow(resources=resources, cap=cap, nbytes=float(nbytes), remaining=float(nbytes))
        self.flows[flow_id] = flow
        if nbytes <= 0:
            finished.append((flow_id, self.now_s))
            del self.flows[flow_id]
            self.completed += 1
        if resources:
            self._recompute()
        else:
            # A flow that crosses no shared resource (a device's transfer within itself: EMS's
            # copies, written and read by their own pool) runs at its ceiling whatever else is
            # in flight, and changes no other flow's share: nothing to recompute (the max-min
            # arrays cost tens of us per flow added while others are in flight).
            flow.rate = cap
        return flow_id, finished

    def ended_alone(
        self, start_s: float, resources: Incidence, cap: float, nbytes: float, now_s: float
    ) -> float | None:
        """`take_alone` counted at once: its fluid end, or None (add the flow)."""
        end = self.take_alone(start_s, resources, cap, nbytes, now_s)
        if end is not None:
            self.count_alone(resources, nbytes)
        return end

    def take_alone(
        self, start_s: float, resources: Incidence, cap: float, nbytes: float, now_s: float
    ) -> float | None:
        """The fluid end of a flow that runs alone and has ended by `now_s`, else None (add it).
        Not counted (`count_alone`, once its transfer is applied: one refused moved nothing).

        Alone: it crosses no shared resource (a device's transfer within itself: EMS's copies,
        at its ceiling whatever else is in flight, see add), or no flow in flight crosses any
        resource and none answered here overlaps its start (a UB transaction on a quiet fabric:
        64 bytes take a nanosecond, and the next transaction is issued microseconds later).
        Answered so, it costs no max-min arrays and no round of the caller's event loop; the
        times are add's. What it gives up: a flow issued within the fluid span of one answered
        alone is run from its start without the other's bytes (a nanosecond for a small one),
        as two flows that arrive in different rounds of the loop always were."""
        if resources:
            if self._busy.size or start_s < self.quiet_until:
                return None
            held = self._rates.get(id(resources))
            if held is not None and held[0] is resources and held[1] == cap:
                rate = held[2]
            else:
                rate = self._alone_rate(resources, cap)
                if len(self._rates) >= RATES_MAX:
                    self._rates.clear()
                self._rates[id(resources)] = (resources, cap, rate)
        elif not math.isfinite(cap):
            raise UnavailableError("a flow crosses no resource and has no ceiling")
        else:
            rate = cap
        if rate <= 0:
            return None
        start = max(start_s, self.now_s) if self.flows else start_s
        end = start + nbytes / rate if nbytes > 0 else start
        if end > now_s:
            return None
        if resources:
            self.quiet_until = max(self.quiet_until, end)
        return end

    def count_alone(self, resources: Incidence, nbytes: float) -> None:
        """A flow `take_alone` answered has been applied: completed, and its bytes carried."""
        self.completed += 1
        res_bytes = self.res_bytes
        for r, w in resources:
            res_bytes[r] += w * nbytes

    def set_capacities(
        self, res_cap: FloatArray, now_s: float
    ) -> tuple[list[tuple[int, float]], list[int]]:
        """Faults changed the trunks: finish what finished, then share the new capacities.
        Returns (finished flows, stalled flows: no bandwidth left, removed)."""
        finished = self.advance(now_s)
        self.res_cap = res_cap
        self._rates.clear()
        self._recompute()
        stalled = [fid for fid, f in self.flows.items() if f.rate <= 0]
        for fid in stalled:
            del self.flows[fid]
        if stalled:
            self._recompute()
        return finished, stalled

    def drop_all(self) -> None:
        """End every flow in flight unfinished (their transfers failed)."""
        self.flows.clear()
        self._recompute()

    def next_event_s(self) -> float | None:
        times = [self.now_s + f.remaining / f.rate for f in self.flows.values() if f.rate > 0]
        return min(times) if times else None

    def advance(self, to_s: float) -> list[tuple[int, float]]:
        """Move emulated time forward to `to_s`, exactly through every completion on the way."""
        finished: list[tuple[int, float]] = []
        while self.flows:
            next_s = self.next_event_s()
            if next_s is None or next_s > to_s:
                break
            self._progress(next_s - self.now_s)
            self.now_s = next_s
            shared = False  # a finished flow shared resources: the others' shares change
            for fid in [fid for fid, f in self.flows.items() if f.done(next_s)]:
                finished.append((fid, next_s))
                if self.flows.pop(fid).resources:
                    shared = True
                self.completed += 1
            if shared:
                self._recompute()
        if to_s > self.now_s:
            self._progress(to_s - self.now_s)
            self.now_s = to_s
        return finished

    def _progress(self, dt: float) -> None:
        if dt <= 0:
            return
        for f in self.flows.values():
            f.remaining = max(0.0, f.remaining - f.rate * dt)
        busy = self._busy
        if busy.size:
            self.res_bytes[busy] += self.res_rate[busy] * dt

    def _recompute(self) -> None:
        """The max-min rates of the flows in flight, over the resources they cross renumbered
        0..k-1 (the same allocation as over every resource: one no flow crosses takes no part)."""
        self.res_rate[self._busy] = 0.0
        # the flows that share resources (one that crosses none keeps its ceiling: see add)
        flows = [f for f in self.flows.values() if f.resources]
        if not flows:
            self._busy = _NO_RESOURCES
            return
        if len(flows) == 1:  # a flow alone (a UB transaction on a quiet fabric): no arrays
            self._alone(flows[0])
            return
        inc_flow = np.array([i for i, f in enumerate(flows) for _ in f.resources], dtype=np.int64)
        inc_res = np.array([r for f in flows for r, _ in f.resources], dtype=np.int64)
        inc_w = np.array([w for f in flows for _, w in f.resources], dtype=np.float64)
        caps = np.array([f.cap for f in flows])
        busy, local = np.unique(inc_res, return_inverse=True)
        rates = maxmin_rates(inc_flow, local, inc_w, self.res_cap[busy], caps)
        for f, r in zip(flows, rates, strict=True):
            f.rate = float(r)
        self.res_rate[busy] = weighted_sum(local, inc_w * rates[inc_flow], len(busy))
        self._busy = busy

    def _alone_rate(self, resources: Incidence, cap: float) -> float:
        """`maxmin` for one flow: its ceiling, or the tightest resource's capacity over the
        flow's share of it, whichever is lower."""
        shares: dict[int, float] = {}
        for r, w in resources:
            shares[r] = shares.get(r, 0.0) + w
        rate = cap
        for r, w in shares.items():
            if w > 0:
                rate = min(rate, max(float(self.res_cap[r]), 0.0) / w)
        if not math.isfinite(rate):
            raise UnavailableError("a flow crosses no resource and has no ceiling")
        return rate

    def _alone(self, flow: _Flow) -> None:
        """The rates of one flow in flight alone (no arrays for the max-min)."""
        rate = flow.rate = self._alone_rate(flow.resources, flow.cap)
        carried: dict[int, float] = {}
        for r, w in flow.resources:
            carried[r] = carried.get(r, 0.0) + w * rate
        busy = np.fromiter(carried, dtype=np.int64, count=len(carried))
        self.res_rate[busy] = np.fromiter(carried.values(), dtype=np.float64, count=len(busy))
        self._busy = busy

    def active_per_resource(self) -> npt.NDArray[np.int64]:
        counts = np.zeros(len(self.res_cap), dtype=np.int64)
        for f in self.flows.values():
            for r, _ in f.resources:
                counts[r] += 1
        return counts
