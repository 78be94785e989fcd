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

from emulator.model.errors import UnavailableError

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
    """Crossings with the padding pointing at resource n_res, a spare one of infinite capacity
    that no flow uses (the solver's arrays have n_res + 1 resources), and each resource's sum of
    shares over every flow (its load: the first pass's, and the bytes it carries when every flow
    moves the same)."""

    rows: IntArray
    flat: IntArray
    w: FloatArray
    w_flat: FloatArray
    load: FloatArray

    @classmethod
    def of(cls, crossings: Crossings, n_res: int) -> Solvable:
        rows: IntArray = np.where(crossings.res < 0, n_res, crossings.res)
        flat, w_flat = rows.ravel(), crossings.w.ravel()
        load = weighted_sum(flat, w_flat, n_res + 1)
        return cls(rows, flat, crossings.w, w_flat, load)


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
    n_res = len(res_cap)
    crossings = Crossings.of(inc_flow, inc_res, inc_w, len(flow_cap))
    rate, left = fill(
        crossings.solvable(n_res),
        np.append(res_cap.astype(np.float64), np.inf),
        flow_cap,
        np.ones(len(flow_cap), dtype=bool),
    )
    return rate, left[:n_res]


def fill(
    flows: Solvable, cap: FloatArray, flow_cap: FloatArray, live: BoolArray
) -> tuple[FloatArray, FloatArray]:
    """Max-min rates of the `live` flows (the others get 0) over resources of capacity `cap`
    (the last one the padding's: Solvable), and what each resource has left over.

    Progressive filling, with every bottleneck that is already decided frozen in the same pass:
    a resource's fill level (what its unfrozen flows would each get if it saturated, after the
    frozen flows' use) only rises as flows freeze elsewhere, at lower rates than it. So a resource
    whose level is the lowest of every resource its flows cross (and of their ceilings) saturates
    at that level whatever else happens, and a flow whose ceiling is below the level of all its
    resources ends at its ceiling. Freezing all of those at once gives the same allocation as
    raising one common level, in as many passes as the bottlenecks have levels of dependency
    rather than one pass per distinct rate. A frozen flow takes no part: its shares count as 0
    and its bottleneck as infinite.
    """
    n_flows, n_slots = len(flow_cap), len(cap)
    rows, flat, w = flows.rows, flows.flat, flows.w
    rate = np.zeros(n_flows)
    spare = cap.copy()
    frozen = ~live
    everyone = bool(live.all())
    w_live = w if everyone else np.where(frozen, 0.0, w)
    while not frozen.all():
        if everyone:  # the first pass over every flow: their load, known
            wsum, everyone = flows.load, False
        else:
            wsum = weighted_sum(flat, w_live.ravel(), n_slots)
        used = wsum > 0
        level = np.full(n_slots, np.inf)
        level[used] = np.maximum(spare[used], 0.0) / wsum[used]
        levels = np.take(level, rows)
        bottleneck = np.minimum(flow_cap, levels.min(axis=0))  # each flow: its lowest level
        bottleneck[frozen] = np.inf
        if not np.isfinite(bottleneck[~frozen]).all():
            raise UnavailableError("a flow crosses no resource and has no ceiling")
        # a resource is decided when no flow of it has a lower bottleneck (up to REL_TOL)
        limit = bottleneck * (1 + REL_TOL)
        blocked = np.zeros(n_slots, dtype=bool)
        blocked[rows[levels > limit]] = True
        decided = used & ~blocked
        newly = ~frozen & (np.take(decided, rows).any(axis=0) | (flow_cap <= limit))
        rate[newly] = bottleneck[newly]
        frozen |= newly
        if frozen.all():  # the last pass: nothing left to share (an EP320 dispatch's only one)
            break
        going = w_live[:, newly] * rate[newly]
        spare -= weighted_sum(rows[:, newly].ravel(), going.ravel(), n_slots)
        w_live = np.where(frozen, 0.0, w_live)
    carried = weighted_sum(flat, (w * rate).ravel(), n_slots)
    return rate, cap - carried
