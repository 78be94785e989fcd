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

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from emulator.model.errors import UnavailableError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
REL_TOL = 1e-9
TIME_EPS_S = 1e-12  # below this a remainder is float noise: emulated time cannot even resolve it


def weighted_sum(index: IntArray, weights: FloatArray, size: int) -> FloatArray:
    """Per-bucket sums (np.bincount with weights, typed as the float array it is)."""
    return np.bincount(index, weights=weights, minlength=size).astype(np.float64, copy=False)


def maxmin_rates(
    inc_flow: IntArray,
    inc_res: IntArray,
    inc_w: FloatArray,
    res_cap: FloatArray,
    flow_cap: FloatArray,
) -> FloatArray:
    """Weighted max-min fair rates of len(flow_cap) flows over resources of capacity res_cap."""
    return maxmin(inc_flow, inc_res, inc_w, res_cap, flow_cap)[0]


def maxmin(
    inc_flow: IntArray,
    inc_res: IntArray,
    inc_w: FloatArray,
    res_cap: FloatArray,
    flow_cap: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Rates, and what each resource has left over (about 0 where it is a bottleneck)."""
    n_flows, n_res = len(flow_cap), len(res_cap)
    rate = np.zeros(n_flows)
    frozen = np.zeros(n_flows, dtype=bool)
    residual = res_cap.astype(np.float64).copy()
    while not frozen.all():
        live_inc = ~frozen[inc_flow]
        wsum = weighted_sum(inc_res[live_inc], inc_w[live_inc], n_res)
        used = wsum > 0
        share = np.full(n_res, np.inf)
        share[used] = np.maximum(residual[used], 0.0) / wsum[used]
        step = min(float(share.min()), float((flow_cap - rate)[~frozen].min()))
        if not np.isfinite(step):
            raise UnavailableError("a flow crosses no resource and has no ceiling")
        rate[~frozen] += step
        residual -= step * wsum
        saturated = used & (residual <= REL_TOL * np.maximum(res_cap, 1.0))
        newly = np.zeros(n_flows, dtype=bool)
        newly[inc_flow[live_inc & saturated[inc_res]]] = True
        newly |= ~frozen & (rate >= flow_cap * (1 - REL_TOL))
        frozen |= newly
    return rate, residual


@dataclass
class FlowBatch:
    """Flows in columnar form: incidences (flow, resource, share) and per-flow bytes and ceiling."""

    inc_flow: IntArray
    inc_res: IntArray
    inc_w: FloatArray
    flow_cap: FloatArray
    nbytes: FloatArray
    latency_s: FloatArray

    @property
    def size(self) -> int:
        return len(self.nbytes)


@dataclass
class BatchResult:
    fluid_end_s: FloatArray  # when each flow's last byte left its bottleneck
    complete_s: FloatArray  # plus its path latency
    res_bytes: FloatArray  # bytes each resource carried
    events: int


def simulate(batch: FlowBatch, res_cap: FloatArray, *, merge_tol: float = 1e-6) -> BatchResult:
    """Time flows that all start at 0, with rates recomputed at every completion.

    Completions within `merge_tol` (relative) of the earliest are taken together, so that a batch
    of near-equal flows costs one rate computation instead of one per flow.
    """
    n = batch.size
    remaining = batch.nbytes.astype(np.float64).copy()
    fluid_end = np.zeros(n)
    done = remaining <= 0
    now = 0.0
    events = 0
    res_bytes = weighted_sum(
        batch.inc_res, batch.inc_w * batch.nbytes[batch.inc_flow], len(res_cap)
    )
    rate = np.zeros(n)
    stale = True
    while not done.all():
        active = ~done
        if stale:
            if active.all():
                rate, residual = maxmin(
                    batch.inc_flow, batch.inc_res, batch.inc_w, res_cap, batch.flow_cap
                )
            else:
                keep = active[batch.inc_flow]
                index = np.cumsum(active) - 1  # renumber the active flows 0..k-1
                rate = np.zeros(n)
                rate[active], residual = maxmin(
                    index[batch.inc_flow[keep]],
                    batch.inc_res[keep],
                    batch.inc_w[keep],
                    res_cap,
                    batch.flow_cap[active],
                )
            if (rate[active] <= 0).any():
                raise UnavailableError("some flows have no bandwidth left on their route")
            saturated = residual <= 1e-6 * res_cap
        finish_in = np.full(n, np.inf)
        finish_in[active] = remaining[active] / rate[active]
        step = float(finish_in.min())
        finishing = active & (finish_in <= step * (1 + merge_tol))
        now += step
        remaining = np.where(active, remaining - rate * step, remaining)
        fluid_end[finishing] = now
        remaining[finishing] = 0.0
        done |= finishing
        events += 1
        # Rates change only if a finished flow released a saturated resource that a remaining
        # flow crosses; otherwise the max-min allocation of the others is the same.
        released = np.zeros(len(res_cap), dtype=bool)
        released[batch.inc_res[finishing[batch.inc_flow]]] = True
        released &= saturated
        stale = bool(released.any()) and bool(released[batch.inc_res[~done[batch.inc_flow]]].any())
    return BatchResult(
        fluid_end_s=fluid_end,
        complete_s=fluid_end + batch.latency_s,
        res_bytes=res_bytes,
        events=events,
    )


@dataclass
class _Flow:
    resources: tuple[tuple[int, float], ...]
    cap: float
    nbytes: float
    remaining: float
    rate: float = 0.0

    @property
    def done(self) -> bool:
        return self.remaining <= REL_TOL * self.nbytes or (
            self.rate > 0 and self.remaining / self.rate <= TIME_EPS_S
        )


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
    _next_id: int = 0

    def __post_init__(self) -> None:
        self.res_bytes = np.zeros(len(self.res_cap))
        self.res_rate = np.zeros(len(self.res_cap))

    def add(
        self, start_s: float, resources: tuple[tuple[int, float], ...], cap: float, nbytes: float
    ) -> tuple[int, list[tuple[int, float]]]:
        """Start a flow at max(start_s, now); returns its id and the flows that finished first.

        An idle fabric starts the flow at start_s even if it was advanced past it meanwhile (its
        issuer stamped it earlier than it arrived): nothing was in flight to be re-timed."""
        if not self.flows and start_s < self.now_s:
            self.now_s = start_s
        finished = self.advance(start_s)
        flow_id = self._next_id
        self._next_id += 1
        self.flows[flow_id] = _Flow(
            resources=resources, cap=cap, nbytes=float(nbytes), remaining=float(nbytes)
        )
        if nbytes <= 0:
            finished.append((flow_id, self.now_s))
            del self.flows[flow_id]
            self.completed += 1
        self._recompute()
        return flow_id, finished

    def set_capacities(
        self, res_cap: FloatArray, now_s: float
    ) -> tuple[list[tuple[int, float]], list[int]]:
        """Faults changed the trunks: finish what finished, then share the new capacities.
        Returns (finished flows, stalled flows: no bandwidth left, removed)."""
        finished = self.advance(now_s)
        self.res_cap = res_cap
        self._recompute()
        stalled = [fid for fid, f in self.flows.items() if f.rate <= 0]
        for fid in stalled:
            del self.flows[fid]
        if stalled:
            self._recompute()
        return finished, stalled

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
            for fid in [fid for fid, f in self.flows.items() if f.done]:
                finished.append((fid, next_s))
                del self.flows[fid]
                self.completed += 1
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
        self.res_bytes += self.res_rate * dt

    def _recompute(self) -> None:
        self.res_rate = np.zeros(len(self.res_cap))
        if not self.flows:
            return
        flows = list(self.flows.values())
        inc_flow = np.array([i for i, f in enumerate(flows) for _ in f.resources], dtype=np.int64)
        inc_res = np.array([r for f in flows for r, _ in f.resources], dtype=np.int64)
        inc_w = np.array([w for f in flows for _, w in f.resources], dtype=np.float64)
        caps = np.array([f.cap for f in flows])
        rates = maxmin_rates(inc_flow, inc_res, inc_w, self.res_cap, caps)
        for f, r in zip(flows, rates, strict=True):
            f.rate = float(r)
        self.res_rate = weighted_sum(inc_res, inc_w * rates[inc_flow], len(self.res_cap))

    def active_per_resource(self) -> npt.NDArray[np.int64]:
        counts = np.zeros(len(self.res_cap), dtype=np.int64)
        for f in self.flows.values():
            for r, _ in f.resources:
                counts[r] += 1
        return counts
