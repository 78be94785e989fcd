"""The max-min solver over padded crossings (fairshare.py) and the cached collective routes give
the timings the incidence-list solver gave (issue 18: EP320 dispatch computed fast, the emulated
result unchanged).

The reference below is the solver as it was before (flowsim.maxmin and flowsim.simulate over
incidence lists, with np.minimum.at), kept verbatim as the oracle; each collective is timed
again through it, phase by phase, on routes built afresh (no cache), and every per-flow array
must agree to 1e-9. The EP320 figures were also printed by the old code itself (GOLDEN).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from cmemu.emulator.model.collectives import ALGORITHMS, DieFlows, moe_ranks, run_collective
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.costmodel import moe_bytes_per_token
from cmemu.emulator.model.endpoints import Endpoint
from cmemu.emulator.model.fairshare import Crossings, fill, maxmin
from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.fabric.link_latency import LinkLatencyParams
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.flowsim import SIM_REL_TOL, FlowBatch, weighted_sum
from cmemu.emulator.model.linkfaults import FaultSet, FaultSpec
from cmemu.emulator.model.linkgraph import LinkGraph, validate_ranks
from cmemu.emulator.model.topology import build

Arrays = npt.NDArray[np.float64]
REL_TOL = 1e-9


def _old_maxmin(
    inc_flow: npt.NDArray[np.int64],
    inc_res: npt.NDArray[np.int64],
    inc_w: Arrays,
    res_cap: Arrays,
    flow_cap: Arrays,
) -> tuple[Arrays, Arrays]:
    n_flows, n_res = len(flow_cap), len(res_cap)
    cap = res_cap.astype(np.float64)
    spare = cap.copy()
    rate = np.zeros(n_flows)
    frozen = np.zeros(n_flows, dtype=bool)
    f_live, r_live, w_live = inc_flow, inc_res, inc_w
    while not frozen.all():
        wsum = weighted_sum(r_live, w_live, n_res)
        used = wsum > 0
        level = np.full(n_res, np.inf)
        level[used] = np.maximum(spare[used], 0.0) / wsum[used]
        bottleneck = np.where(frozen, np.inf, flow_cap)
        np.minimum.at(bottleneck, f_live, level[r_live])
        lowest = np.full(n_res, np.inf)
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


def _old_simulate(batch: FlowBatch, res_cap: Arrays) -> tuple[Arrays, Arrays]:
    """(complete_s, res_bytes) as flowsim.simulate computed them over incidence lists."""
    f_all, r_all, w_all = batch.inc_flow, batch.inc_res, batch.inc_w
    n = batch.size
    remaining = batch.nbytes.astype(np.float64).copy()
    fluid_end = np.zeros(n)
    done = remaining <= 0
    now = 0.0
    res_bytes = weighted_sum(r_all, w_all * batch.nbytes[f_all], len(res_cap))
    rate = np.zeros(n)
    old_rate, lag = rate, np.zeros(n)
    saturated = np.zeros(len(res_cap), dtype=bool)
    stale = True
    while not done.all():
        active = ~done
        if stale:
            keep = active[f_all]
            index = np.cumsum(active) - 1
            rate = np.zeros(n)
            rate[active], residual = _old_maxmin(
                index[f_all[keep]], r_all[keep], w_all[keep], res_cap, batch.flow_cap[active]
            )
            saturated = residual <= 1e-6 * res_cap
            remaining = np.maximum(remaining - (rate - old_rate) * lag, 0.0)
        finish_in = np.full(n, np.inf)
        finish_in[active] = remaining[active] / rate[active]
        first = float(finish_in.min())
        horizon = first * (1 + REL_TOL) + SIM_REL_TOL * (now + first)
        finishing = active & (finish_in <= horizon)
        step = float(finish_in[finishing].max())
        fluid_end[finishing] = now + finish_in[finishing]
        lag = np.where(active & ~finishing, step - float(finish_in[finishing].mean()), 0.0)
        old_rate = rate
        now += step
        remaining = np.where(active, remaining - rate * step, remaining)
        remaining[finishing] = 0.0
        done |= finishing
        released = np.zeros(len(res_cap), dtype=bool)
        released[r_all[finishing[f_all]]] = True
        released &= saturated
        stale = bool(released.any()) and bool(released[r_all[~done[f_all]]].any())
    return fluid_end + batch.latency_s, res_bytes


def _reference(
    graph: LinkGraph, ranks: list[Endpoint], spec: CollectiveSpec, caps: Arrays | None = None
) -> tuple[Arrays, Arrays]:
    """Per-flow completion times and per-trunk bytes of the collective, by the old solver on
    routes built afresh (and as an incidence list, the form the old solver took)."""
    algorithm = ALGORITHMS[spec.op]
    if algorithm.moe is not None:
        per_token = moe_bytes_per_token(algorithm.moe, graph.profile)
        top_k = spec.top_k or graph.profile.moe.top_k
        spec = replace(spec, top_k=top_k, bytes_per_token=per_token)
    routes = DieFlows(graph, ranks)
    caps = graph.trunk_cap() if caps is None else caps
    start, complete, res_bytes = 0.0, [], np.zeros(len(caps))
    for phase in algorithm.phases(len(ranks), spec):
        batch = routes.batch(phase)
        listed = FlowBatch(*batch.incidences, batch.flow_cap, batch.nbytes, batch.latency_s)
        done_s, carried = _old_simulate(listed, caps)
        complete.append(start + done_s)
        start += float(done_s.max())
        res_bytes += carried
    return np.concatenate(complete), res_bytes


def _faulted_mini() -> LinkGraph:
    graph = LinkGraph(build("cm-mini"))
    faults = FaultSet(graph)
    for spec in (
        FaultSpec(
            kind="link-degraded",
            params=LinkDegradedParams(factor=0.3),
            target="n01-npu7.d0~n01-l1s4",
        ),
        FaultSpec(kind="link-down", params=NoParams(), target="n00-l1s2~l2-p2-s5"),
        FaultSpec(
            kind="link-degraded",
            params=LinkDegradedParams(factor=0.5),
            target="n01-npu4.d1>n01-npu4.d0",
        ),
        FaultSpec(
            kind="link-latency",
            params=LinkLatencyParams(latency_us=3.0),
            target="n00-npu1.d1>n00-l1s0",
        ),
    ):
        faults.add(spec)
    return graph


def _all_dies(graph: LinkGraph) -> list[Endpoint]:
    return validate_ranks(graph, [d.id for d in graph.topology.devices if d.kind == "npu"])


PAIRS = tuple(int(x) for x in np.random.default_rng(7).integers(0, 1 << 22, 32 * 32))
SMALL = {
    "all-reduce": CollectiveSpec(op="all-reduce", bytes=1 << 24),
    "all-to-all": CollectiveSpec(op="all-to-all", bytes_per_pair=1 << 20),
    "all-to-all of unequal pairs": CollectiveSpec(op="all-to-all", pair_bytes=PAIRS),
    "broadcast": CollectiveSpec(op="broadcast", bytes=1 << 22, root=3),
    "moe-dispatch": CollectiveSpec(op="moe-dispatch", tokens_per_rank=96),
}


@pytest.mark.parametrize("faulted", [False, True], ids=["healthy", "faulted"])
@pytest.mark.parametrize("case", sorted(SMALL))
def test_small_collectives_time_as_the_incidence_list_solver_did(case: str, faulted: bool) -> None:
    graph = _faulted_mini() if faulted else LinkGraph(build("cm-mini"))
    ranks = _all_dies(graph)
    assert len(ranks) == 32
    timing = run_collective(graph, ranks, SMALL[case])
    again = run_collective(graph, ranks, SMALL[case])  # from the cached routes
    complete, res_bytes = _reference(graph, ranks, SMALL[case])
    for got in (timing, again):
        np.testing.assert_allclose(got.flow_complete_s, complete, rtol=1e-9, atol=0)
        np.testing.assert_allclose(got.res_bytes, res_bytes, rtol=1e-9, atol=1e-3)


# printed by the incidence-list solver (the commit before fairshare.py): transfer_s, the sum and
# the least of the per-flow completion times, and the bytes all trunks carried
GOLDEN = {
    "moe-dispatch": (3.689499401197605e-05, 3.752059248415171, 9.77055489021956e-07, 7343308800.0),
    "moe-combine": (6.73133125748503e-05, 6.847449565696339, 1.0464939986693279e-06, 13707509760.0),
}


@pytest.fixture(scope="module")
def cm384() -> LinkGraph:
    return LinkGraph(build("cm384"))


@pytest.mark.parametrize("op", sorted(GOLDEN))
def test_ep320_times_as_the_incidence_list_solver_did(cm384: LinkGraph, op: str) -> None:
    ranks = moe_ranks(cm384, 320)
    spec = CollectiveSpec(op=op, tokens_per_rank=96)
    timing = run_collective(cm384, ranks, spec)
    assert timing.flows == 102_080
    transfer, total, least, carried = GOLDEN[op]
    got = (
        timing.transfer_s,
        float(timing.flow_complete_s.sum()),
        float(timing.flow_complete_s.min()),
        float(timing.res_bytes.sum()),
    )
    assert got == pytest.approx((transfer, total, least, carried), rel=1e-9)
    complete, res_bytes = _reference(cm384, ranks, spec)
    np.testing.assert_allclose(timing.flow_complete_s, complete, rtol=1e-9, atol=0)
    np.testing.assert_allclose(timing.res_bytes, res_bytes, rtol=1e-9, atol=1e-3)


def test_the_comparison_sees_a_one_percent_slower_trunk(cm384: LinkGraph) -> None:
    """Must fail to match: the same dispatch with one die's ports 1% slower in the reference
    differs beyond the tolerance the tests above allow."""
    ranks = moe_ranks(cm384, 320)
    spec = CollectiveSpec(op="moe-dispatch", tokens_per_rank=96)
    timing = run_collective(cm384, ranks, spec)
    caps = cm384.trunk_cap().copy()
    caps[ranks[5].out[0][0]] *= 0.99
    complete, _ = _reference(cm384, ranks, spec, caps)
    assert not np.allclose(timing.flow_complete_s, complete, rtol=1e-9, atol=0)


def test_crossings_hold_the_incidences_they_were_built_from() -> None:
    inc_flow = np.array([2, 0, 1, 0, 2, 2], dtype=np.int64)
    inc_res = np.array([5, 1, 3, 2, 0, 4], dtype=np.int64)
    inc_w = np.array([0.5, 1.0, 1.0, 2.0, 0.25, 1.0])
    crossings = Crossings.of(inc_flow, inc_res, inc_w, 4)  # flow 3 crosses nothing
    assert crossings.res.shape == (3, 4)
    assert crossings.res[:, 3].tolist() == [-1, -1, -1]
    back = set(zip(*(a.tolist() for a in crossings.incidences()), strict=True))
    assert back == set(zip(inc_flow.tolist(), inc_res.tolist(), inc_w.tolist(), strict=True))


def test_fill_agrees_with_the_incidence_list_solver_on_random_flows() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n_flows, n_res = int(rng.integers(1, 60)), int(rng.integers(1, 12))
        per = rng.integers(1, 4, n_flows)
        inc_flow = np.repeat(np.arange(n_flows), per).astype(np.int64)
        inc_res = rng.integers(0, n_res, len(inc_flow)).astype(np.int64)
        inc_w = rng.choice([0.5, 1.0, 2.0], len(inc_flow))
        res_cap = rng.uniform(1.0, 10.0, n_res)
        flow_cap = np.where(rng.random(n_flows) < 0.3, rng.uniform(0.1, 2.0, n_flows), np.inf)
        order = rng.permutation(len(inc_flow))  # any order of incidences
        args = inc_flow[order], inc_res[order], inc_w[order], res_cap, flow_cap
        flows = Crossings.of(*args[:3], n_flows).solvable(n_res)
        rate, busy_left = fill(flows, flows.caps(res_cap), flow_cap, np.ones(n_flows, bool))
        left = res_cap.copy()
        left[flows.busy] = busy_left[:-1]
        old_rate, old_left = _old_maxmin(*args)
        np.testing.assert_allclose(maxmin(*args)[0], old_rate, rtol=1e-9)
        np.testing.assert_allclose(rate, old_rate, rtol=1e-9)
        np.testing.assert_allclose(left, old_left, rtol=1e-9, atol=1e-9)
