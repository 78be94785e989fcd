"""The flow simulator on small hand-checked cases: max-min fairness, completions, live arrivals."""

from __future__ import annotations

import numpy as np
import pytest

from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.model.flowsim import FlowBatch, LiveFlows, maxmin_rates, simulate, weighted_sum


def _inc(flows: list[list[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f = np.array([i for i, rs in enumerate(flows) for _ in rs], dtype=np.int64)
    r = np.array([x for rs in flows for x, _ in rs], dtype=np.int64)
    w = np.array([y for rs in flows for _, y in rs], dtype=np.float64)
    return f, r, w


def test_maxmin_classic_three_flows_two_links() -> None:
    # link 0 (cap 10) carries flows a and b; link 1 (cap 4) carries b and c.
    f, r, w = _inc([[(0, 1.0)], [(0, 1.0), (1, 1.0)], [(1, 1.0)]])
    rates = maxmin_rates(f, r, w, np.array([10.0, 4.0]), np.full(3, np.inf))
    assert rates == pytest.approx([8.0, 2.0, 2.0])


def test_maxmin_respects_flow_ceilings_and_shares() -> None:
    # a is capped at 1; b takes the rest. c crosses link 1 at half weight (striped over two).
    f, r, w = _inc([[(0, 1.0)], [(0, 1.0)], [(1, 0.5)]])
    rates = maxmin_rates(f, r, w, np.array([10.0, 3.0]), np.array([1.0, np.inf, np.inf]))
    assert rates == pytest.approx([1.0, 9.0, 6.0])


def test_sixteen_flows_into_one_link_get_a_sixteenth_each() -> None:
    n = 16
    f, r, w = _inc([[(i, 1.0), (n, 1.0)] for i in range(n)])
    caps = np.array([100.0] * n + [160.0])
    rates = maxmin_rates(f, r, w, caps, np.full(n, np.inf))
    assert rates == pytest.approx([10.0] * n)


def test_batch_recomputes_rates_when_a_flow_finishes() -> None:
    # two flows share one link of 10: the 10-byte one ends at t=2; the 30-byte one then runs
    # alone at 10 and ends at 2 + 20/10 = 4.
    f, r, w = _inc([[(0, 1.0)], [(0, 1.0)]])
    batch = FlowBatch(f, r, w, np.full(2, np.inf), np.array([10.0, 30.0]), np.array([0.5, 0.0]))
    result = simulate(batch, np.array([10.0]))
    assert result.fluid_end_s == pytest.approx([2.0, 4.0])
    assert result.complete_s == pytest.approx([2.5, 4.0])  # latency added at the end
    assert result.res_bytes == pytest.approx([40.0])
    assert result.events == 2


def test_batch_with_a_dead_resource_is_unavailable() -> None:
    f, r, w = _inc([[(0, 1.0)]])
    batch = FlowBatch(f, r, w, np.full(1, np.inf), np.array([1.0]), np.zeros(1))
    with pytest.raises(UnavailableError):
        simulate(batch, np.array([0.0]))


def test_live_flows_share_from_the_moment_the_second_arrives() -> None:
    live = LiveFlows(res_cap=np.array([100.0, 100.0, 160.0]))
    a, _ = live.add(0.0, ((0, 1.0), (2, 1.0)), np.inf, 100.0)
    b, finished = live.add(0.5, ((1, 1.0), (2, 1.0)), np.inf, 100.0)
    assert not finished
    # a alone at 100 until 0.5 (50 left), then both at 80: a ends at 0.5 + 50/80 = 1.125;
    # b then runs at 100: 50 sent by 1.125, 50 more ends at 1.625.
    finished = live.advance(10.0)
    assert [f for f, _ in finished] == [a, b]
    assert [t for _, t in finished] == pytest.approx([1.125, 1.625])
    assert live.res_bytes[2] == pytest.approx(200.0)


def test_live_idle_fabric_starts_a_late_arrival_at_its_issue_time() -> None:
    live = LiveFlows(res_cap=np.array([10.0]))
    live.advance(5.0)
    flow, _ = live.add(3.0, ((0, 1.0),), np.inf, 10.0)
    assert [(f, round(t, 9)) for f, t in live.advance(100.0)] == [(flow, 4.0)]


def test_live_flows_finish_late_in_a_run_when_float_time_cannot_resolve_them() -> None:
    """Past about 4,500 emulated seconds one step of a float clock exceeds 1e-12 s: a flow
    ending less than a step after another once never finished, and the fabric's clock loop
    spun forever (found by the serving driver at a high time scale)."""
    flows = LiveFlows(res_cap=np.array([1e11]), now_s=20_000.0)
    flows.add(20_000.0, ((0, 1.0),), 1e11, 1000.0)
    flows.add(20_000.0, ((0, 1.0),), 1e11, 1000.2)
    finished = flows.advance(20_001.0)
    assert len(finished) == 2 and not flows.flows


def test_live_capacity_loss_stalls_flows_that_have_nothing_left() -> None:
    live = LiveFlows(res_cap=np.array([10.0, 10.0]))
    a, _ = live.add(0.0, ((0, 1.0),), np.inf, 100.0)
    b, _ = live.add(0.0, ((1, 1.0),), np.inf, 100.0)
    finished, stalled = live.set_capacities(np.array([10.0, 0.0]), 1.0)
    assert finished == [] and stalled == [b]
    assert [(f, round(t, 9)) for f, t in live.advance(100.0)] == [(a, 10.0)]


def _exact_reference(batch: FlowBatch, caps: np.ndarray) -> np.ndarray:
    """Slow and exact: rates recomputed after every single completion."""
    remaining = batch.nbytes.astype(float).copy()
    end = np.zeros(batch.size)
    done = remaining <= 0
    now = 0.0
    while not done.all():
        keep = ~done[batch.inc_flow]
        index = np.cumsum(~done) - 1
        rate = np.zeros(batch.size)
        rate[~done] = maxmin_rates(
            index[batch.inc_flow[keep]],
            batch.inc_res[keep],
            batch.inc_w[keep],
            caps,
            batch.flow_cap[~done],
        )
        finish = np.where(done, np.inf, remaining / np.where(done, 1.0, rate))
        step = float(finish.min())
        now += step
        remaining = np.where(done, 0.0, remaining - rate * step)
        first = ~done & (finish <= step * (1 + 1e-12))
        end[first] = now
        done |= first
    return end


def _random_batch(rng: np.random.Generator, n_flows: int, n_res: int) -> FlowBatch:
    flows = [
        [(int(r), 1.0) for r in rng.choice(n_res, size=int(rng.integers(1, 4)), replace=False)]
        for _ in range(n_flows)
    ]
    f, r, w = _inc(flows)
    cap = np.where(rng.random(n_flows) < 0.2, rng.uniform(1.0, 5.0, n_flows), np.inf)
    nbytes = rng.uniform(1.0, 100.0, n_flows)
    return FlowBatch(f, r, w, cap, nbytes, np.zeros(n_flows))


@pytest.mark.parametrize("seed", range(8))
def test_batched_completions_stay_within_one_percent_of_exact(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = _random_batch(rng, 150, 12)
    caps = rng.uniform(5.0, 20.0, 12)
    exact = _exact_reference(batch, caps)
    result = simulate(batch, caps)
    assert result.fluid_end_s == pytest.approx(exact, rel=1e-2)
    assert simulate(batch, caps, rel_tol=0).fluid_end_s == pytest.approx(exact, rel=1e-9)


def test_pair_bytes_all_to_all_of_64_dies_needs_few_rate_computations() -> None:
    from cmemu.emulator.model.collectives import DieFlows, Phase
    from cmemu.emulator.model.linkgraph import LinkGraph, validate_ranks
    from cmemu.emulator.model.topology import build

    graph = LinkGraph(build("cm384"))
    npus = [d.id for d in graph.topology.devices if d.kind == "npu"][:32]
    ranks = validate_ranks(graph, npus)
    n = len(ranks)
    src, dst = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    keep = src != dst
    sizes = np.random.default_rng(0).integers(1 << 16, 1 << 24, int(keep.sum())).astype(float)
    batch = DieFlows(graph, ranks).batch(Phase(src[keep], dst[keep], sizes))
    assert batch.size == 4032
    result = simulate(batch, graph.trunk_cap())
    assert result.recomputations <= 400  # exact: one per flow, about 4,000


class _EveryResource(LiveFlows):
    """LiveFlows as it was: max-min over every resource of the fabric at each change."""

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
        inc_flow, inc_res, inc_w = _inc([list(f.resources) for f in flows])
        rates = maxmin_rates(
            inc_flow, inc_res, inc_w, self.res_cap, np.array([f.cap for f in flows])
        )
        for f, r in zip(flows, rates, strict=True):
            f.rate = float(r)
        self.res_rate = weighted_sum(inc_res, inc_w * rates[inc_flow], len(self.res_cap))


@pytest.mark.parametrize("seed", range(6))
def test_live_flows_over_the_busy_resources_time_as_over_every_resource(seed: int) -> None:
    """LiveFlows computes over the resources its flows cross (one flow alone: without arrays):
    the same completions, rates and bytes per resource as max-min over all of them, with a flow
    crossing one resource twice, resources of no capacity (links down) and a capacity change."""
    rng = np.random.default_rng(seed)
    n_res = 400
    cap = rng.uniform(1e9, 50e9, n_res)
    cap[rng.choice(n_res, 3, replace=False)] = 0.0
    fast, slow = LiveFlows(res_cap=cap.copy()), _EveryResource(res_cap=cap.copy())
    now = 0.0
    for step in range(60):
        k = int(rng.integers(1, 5))
        picked = zip(rng.choice(n_res, k), rng.uniform(0.2, 1.0, k), strict=True)
        resources = tuple((int(r), float(w)) for r, w in picked)
        if rng.random() < 0.2:
            resources += (resources[0],)  # the same trunk twice
        now += float(rng.uniform(0, 2e-3))
        flow = (now, resources, float(rng.uniform(5e9, 80e9)), float(rng.uniform(1e3, 1e8)))
        assert fast.add(*flow) == slow.add(*flow)
        if step == 30:  # a fault: a busy trunk loses most of its capacity
            cut = cap.copy()
            cut[resources[0][0]] *= 0.1
            assert fast.set_capacities(cut.copy(), now) == slow.set_capacities(cut.copy(), now)
        assert [f.rate for f in fast.flows.values()] == pytest.approx(
            [f.rate for f in slow.flows.values()], rel=1e-12, abs=0.0
        )
        assert fast.res_rate == pytest.approx(slow.res_rate, rel=1e-12, abs=1e-6)
    assert fast.advance(now + 10.0) == slow.advance(now + 10.0)
    assert fast.res_bytes == pytest.approx(slow.res_bytes, rel=1e-9, abs=1e-3)
    assert fast.res_bytes.sum() > 0
    assert fast.flows.keys() == slow.flows.keys()  # only flows over a dead trunk are left
    assert all(f.rate == 0 for f in fast.flows.values())


def _finish_times(extra: tuple[tuple[int, float], ...] | None) -> dict[int, float]:
    """Two flows sharing resource 0 (10 B/s), and a third of 50 bytes with a ceiling of
    25 B/s crossing `extra` (None: no third flow)."""
    live = LiveFlows(res_cap=np.array([10.0, 1000.0]))
    live.add(0.0, ((0, 1.0),), np.inf, 100.0)
    live.add(0.0, ((0, 1.0),), np.inf, 40.0)
    if extra is not None:
        live.add(0.0, extra, 25.0, 50.0)
    return {f: round(t, 9) for f, t in live.advance(1000.0)}


@pytest.mark.parametrize("crosses", [(), ((0, 1.0),)])
def test_a_flow_crossing_no_resource_runs_at_its_ceiling_and_slows_no_other(
    crosses: tuple[tuple[int, float], ...],
) -> None:
    """A transfer within one device (EMS's copies) crosses no shared resource: it ends at its
    ceiling's pace (50 B at 25 B/s: 2 s) and leaves the others' shares alone. Its twin crosses
    the shared resource and must slow them (and be slowed)."""
    alone = _finish_times(None)
    assert alone == {1: 8.0, 0: 14.0}  # 5 B/s each until the 40 B one ends, then 10 B/s
    times = _finish_times(crosses)
    if not crosses:
        assert times == {**alone, 2: 2.0}
    else:
        assert times[0] > alone[0] and times[1] > alone[1] and times[2] > 2.0


def test_a_flow_crossing_no_resource_without_a_ceiling_is_refused() -> None:
    live = LiveFlows(res_cap=np.array([10.0]))
    with pytest.raises(UnavailableError):
        live.add(0.0, (), np.inf, 100.0)
    assert not live.flows
