"""Max-min fair sharing of resources among flows: the solver that flowsim.py runs (for a batch
of flows starting together and for the flows of a running fabric).

Each flow crosses some resources (trunks), each at a share, and has its own ceiling. Rates are the
weighted max-min fair allocation, found by progressive filling (see `fill`). A batch's crossings
are held as a padded matrix (Crossings), so that each pass is a few gathers and elementwise
minima over whole rows: an EP320 dispatch (102,080 flows, 400,000 crossings) takes one pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.scratch import scratch

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Incidences = tuple[IntArray, IntArray, FloatArray]  # (flow, resource, share), one per crossing
REL_TOL = 1e-9


def weighted_sum(index: IntArray, weights: FloatArray, size: int) -> FloatArray:
    """Per-bucket sums (np.bincount with weights, typed as the float array it is)."""
    return np.bincount(index, weights=weights, minlength=size).astype(np.float64, copy=False)


@dataclass(frozen=True)
class Crossings:
    """Which resources each flow crosses, as a matrix: column f of `res` lists flow f's
    resources (-1 where it crosses fewer than the rows), `w` its share of each (0 there).

    The solver's work per pass is then gathers and elementwise minima over whole rows, where
    an incidence list needs a scatter per pass (np.minimum.at): 3-4 times slower over the
    400,000 incidences of an EP320 dispatch. A row per slot, not per flow, so that a minimum over
    a flow's resources is an elementwise minimum of a few contiguous rows."""

    res: IntArray  # (slots, flows)
    w: FloatArray
    # what solve() derived, per number of resources: kept with the routes that hold these
    _solved: dict[int, Solvable] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, inc_flow: IntArray, inc_res: IntArray, inc_w: FloatArray, flows: int) -> Crossings:
        """From an incidence list (flow, resource, share) in any order."""
        counts = np.bincount(inc_flow, minlength=flows)
        slots = max(int(counts.max(initial=0)), 1)
        order = np.argsort(inc_flow, kind="stable")
        flow = inc_flow[order]
        slot = np.arange(len(flow)) - (np.cumsum(counts) - counts)[flow]
        res = np.full((slots, flows), -1, dtype=np.int64)
        w = np.zeros((slots, flows))
        res[slot, flow] = inc_res[order]
        w[slot, flow] = inc_w[order]
        return cls(res, w)

    def incidences(self) -> Incidences:
        """The incidence list, slot by slot (Crossings.of's inverse, up to the order)."""
        slot, flow = np.nonzero(self.res >= 0)
        return flow.astype(np.int64), self.res[slot, flow], self.w[slot, flow]

    def solvable(self, n_res: int) -> Solvable:
        """The form the solver takes, over n_res resources: computed once (a collective's
        routes are reused by every phase and request between the same ranks)."""
        found = self._solved.get(n_res)
        if found is None:
            found = self._solved[n_res] = Solvable.of(self, n_res)
        return found


@dataclass(frozen=True)
class Solvable:
    """Crossings over the resources some flow crosses (`busy`, renumbered 0..k-1: a 64-die
    collective on cm384 crosses a few hundred of its 2,880 trunks, and every pass costs per
    resource too), with the padding pointing at resource k, a spare one of infinite capacity
    that no flow uses (the solver's arrays have k + 1 resources: `caps`), and each resource's
    sum of shares over every flow (its load: the first pass's, and the bytes it carries when
    every flow moves the same)."""

    busy: IntArray
    rows: IntArray
    flat: IntArray
    w: FloatArray
    w_flat: FloatArray
    load: FloatArray

    @classmethod
    def of(cls, crossings: Crossings, n_res: int) -> Solvable:
        crossed = np.zeros(n_res + 1, dtype=bool)
        crossed[crossings.res] = True  # the padding (-1) marks the spare last one
        busy = np.flatnonzero(crossed[:n_res])
        local = np.full(n_res + 1, len(busy), dtype=np.int64)  # the padding: local[-1]
        local[busy] = np.arange(len(busy))
        rows: IntArray = local[crossings.res]
        flat, w_flat = rows.ravel(), crossings.w.ravel()
        load = weighted_sum(flat, w_flat, len(busy) + 1)
        return cls(busy, rows, flat, crossings.w, w_flat, load)

    def caps(self, res_cap: FloatArray) -> FloatArray:
        """The capacities of the busy resources, and the padding's (infinite)."""
        return np.append(res_cap[self.busy].astype(np.float64), np.inf)

    def carried(self, per_flow: FloatArray) -> FloatArray:
        """Per busy resource, the sum of each flow's `per_flow` times its share."""
        if len(per_flow) and per_flow.min() == per_flow.max():  # alike (a mesh): the load's
            return self.load * float(per_flow[0])
        return weighted_sum(self.flat, (self.w * per_flow).ravel(), len(self.load))

    def spread(self, local: FloatArray, n_res: int) -> FloatArray:
        """Per busy resource (and the padding) -> per resource of all n_res (0 elsewhere)."""
        out = np.zeros(n_res)
        out[self.busy] = local[:-1]
        return out


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
    """Rates, and what each resource has left over (about 0 where it is a bottleneck).

    The same progressive filling as `fill` (see there), over an incidence list: for the few
    flows of a running fabric (flowsim.LiveFlows, at every start and completion) this costs a
    third of building Crossings first; for a batch of thousands, `fill` is the faster.
    """
    n_flows, n_res = len(flow_cap), len(res_cap)
    cap = res_cap.astype(np.float64)
    spare = cap.copy()
    rate = np.zeros(n_flows)
    frozen = np.zeros(n_flows, dtype=bool)
    f_live, r_live, w_live = inc_flow, inc_res, inc_w  # the incidences of unfrozen flows
    while not frozen.all():
        wsum = weighted_sum(r_live, w_live, n_res)
        used = wsum > 0
        level = np.full(n_res, np.inf)
        level[used] = np.maximum(spare[used], 0.0) / wsum[used]
        bottleneck = np.where(frozen, np.inf, flow_cap)  # each unfrozen flow: its lowest level
        np.minimum.at(bottleneck, f_live, level[r_live])
        if not np.isfinite(bottleneck[~frozen]).all():
            raise UnavailableError("a flow crosses no resource and has no ceiling")
        lowest = np.full(n_res, np.inf)  # each resource: the lowest bottleneck of its flows
        np.minimum.at(lowest, r_live, bottleneck[f_live])
        decided = used & (level <= lowest * (1 + REL_TOL))
        newly = np.zeros(n_flows, dtype=bool)
        newly[f_live[decided[r_live]]] = True
        newly |= ~frozen & (flow_cap <= bottleneck * (1 + REL_TOL))
        rate[newly] = bottleneck[newly]
        frozen |= newly
        if frozen.all():
            break
        going = newly[f_live]
        spare -= weighted_sum(r_live[going], w_live[going] * rate[f_live[going]], n_res)
        f_live, r_live, w_live = f_live[~going], r_live[~going], w_live[~going]
    return rate, cap - weighted_sum(inc_res, inc_w * rate[inc_flow], n_res)


def fill(
    flows: Solvable,
    cap: FloatArray,
    flow_cap: FloatArray,
    live: BoolArray,
    *,
    out: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Max-min rates of the `live` flows (the others get 0) over the busy resources of capacity
    `cap` (Solvable.caps: the last one the padding's), and what each has left over. The rates
    are written to `out` if given (simulate passes a work buffer of its own).

    Progressive filling, with every bottleneck that is already decided frozen in the same pass:
    a resource's fill level (what its unfrozen flows would each get if it saturated, after the
    frozen flows' use) only rises as flows freeze elsewhere, at lower rates than it. So a resource
    whose level is the lowest of every resource its flows cross (and of their ceilings) saturates
    at that level whatever else happens, and a flow whose ceiling is below the level of all its
    resources ends at its ceiling. Freezing all of those at once gives the same allocation as
    raising one common level, in as many passes as the bottlenecks have levels of dependency
    rather than one pass per distinct rate. The frozen flows' columns are dropped after each
    pass, so later passes (and the recomputations of a batch whose flows complete one by one)
    cost what is left to share, not the whole batch.

    The temporaries as large as the batch are this thread's work buffers (scratch.py): an EP320
    dispatch's first pass otherwise spends more time faulting in fresh pages than computing.
    """
    n_slots = len(cap)
    rate = np.empty(len(flow_cap)) if out is None else out
    spare = cap.copy()
    if live.all():  # the first pass's load is known
        idx, rows, w, ceiling, wsum = None, flows.rows, flows.w, flow_cap, flows.load
        live_rate = rate
    else:
        idx = np.flatnonzero(live)
        rows, w, ceiling = flows.rows[:, idx], flows.w[:, idx], flow_cap[idx]
        wsum = weighted_sum(rows.ravel(), w.ravel(), n_slots)
        live_rate = scratch("fill.live_rate", (len(idx),), np.float64)
    live_rows, live_w = rows, w  # every live flow's, for what they carry in the end
    left: IntArray | None = None  # the unfrozen flows, as columns of the live ones (None: all)
    while True:
        bottleneck, newly = _pass(spare, wsum, rows, ceiling)
        if newly.all():  # the last pass: nothing left to share (an EP320 dispatch's only one)
            if left is None:
                live_rate[:] = bottleneck
            else:
                live_rate[left] = bottleneck
            break
        if left is None:
            left = np.arange(len(newly))
        live_rate[left[newly]] = bottleneck[newly]
        go, stay = np.flatnonzero(newly), np.flatnonzero(~newly)  # (columns: by index, faster)
        going = w.take(go, axis=1) * bottleneck[go]
        spare -= weighted_sum(rows.take(go, axis=1).ravel(), going.ravel(), n_slots)
        left, ceiling = left[stay], ceiling[stay]
        rows, w = rows.take(stay, axis=1), w.take(stay, axis=1)
        wsum = weighted_sum(rows.ravel(), w.ravel(), n_slots)
    moved = np.multiply(live_w, live_rate, out=scratch("fill.levels", live_w.shape, np.float64))
    carried = weighted_sum(live_rows.ravel(), moved.ravel(), n_slots)
    if idx is not None:
        rate[:] = 0.0
        rate[idx] = live_rate
    return rate, cap - carried


def _pass(
    spare: FloatArray, wsum: FloatArray, rows: IntArray, ceiling: FloatArray
) -> tuple[FloatArray, BoolArray]:
    """One pass of `fill` over the unfrozen flows (the columns of `rows`): each one's bottleneck
    (its lowest level, or its ceiling) and whether it freezes at it. Both are work buffers."""
    shape, n, n_slots = rows.shape, rows.shape[1], len(spare)
    used = wsum > 0
    level = np.full(n_slots, np.inf)
    level[used] = np.maximum(spare[used], 0.0) / wsum[used]
    levels = np.take(level, rows, out=scratch("fill.levels", shape, np.float64), mode="clip")
    bottleneck = np.minimum.reduce(levels, axis=0, out=scratch("fill.low", (n,), np.float64))
    np.minimum(ceiling, bottleneck, out=bottleneck)  # each flow: its lowest level
    if not np.isfinite(bottleneck, out=scratch("fill.flag", (n,), np.bool_)).all():
        raise UnavailableError("a flow crosses no resource and has no ceiling")
    # a resource is decided when no flow of it has a lower bottleneck (up to REL_TOL)
    limit = np.multiply(bottleneck, 1 + REL_TOL, out=scratch("fill.limit", (n,), np.float64))
    above = np.greater(levels, limit, out=scratch("fill.above", shape, np.bool_))
    blocked = np.zeros(n_slots, dtype=bool)
    blocked[rows[above]] = True
    decided = used & ~blocked
    reached = np.take(decided, rows, out=scratch("fill.reached", shape, np.bool_), mode="clip")
    newly = np.logical_or.reduce(reached, axis=0, out=scratch("fill.newly", (n,), np.bool_))
    newly |= np.less_equal(ceiling, limit, out=scratch("fill.flag", (n,), np.bool_))
    return bottleneck, newly
