"""Data-parallel training over N supernodes: the closed form of the cross-supernode all-reduce
checked flow by flow on the plane of real `build_cluster` documents, oversubscription hurting,
the step reusing the one-supernode model, and linearity."""

from __future__ import annotations

import itertools
import math

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.flowsim import SIM_REL_TOL
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.topology import build
from cmemu.emulator.model.training.scaleout import (
    CROSS_ALGORITHMS,
    PlaneRoutes,
    SupernodeStep,
    cross_allreduce,
    cross_die_bytes_per_s,
    exposed_allreduce_s,
    preset_supernodes,
    scaleout_step,
    supernode_step,
    time_cross_flows,
    with_oversubscription,
)
from cmemu.emulator.model.training.spec import shape_of
from cmemu.emulator.model.training.timing import ModelTimer, first_dies

# Every round's flows are equal, so the flow simulator's one approximation (it takes
# completions within SIM_REL_TOL of the elapsed time together) cannot even apply: the two should
# agree to float rounding. SIM_REL_TOL is the bound the simulator itself promises, so a larger
# gap would be a wrong closed form, not simulator noise.
TOLERANCE = SIM_REL_TOL
SHARD = 4e6  # bytes per die: large enough that bandwidth, not latency, dominates


@pytest.fixture(scope="module")
def mini() -> SupernodeStep:
    return supernode_step("cm-mini")


def _profile(leaf: float = 1.0, spine: float = 1.0) -> HardwareProfile:
    return with_oversubscription(DEFAULT_PROFILE, leaf=leaf, spine=spine)


def _agree(preset: str, algorithm: str, profile: HardwareProfile) -> tuple[float, float]:
    topology = build_cluster(preset, profile=profile)[0]
    assert topology.scaleout is not None
    flows = time_cross_flows(topology, SHARD, algorithm, profile)
    closed = cross_allreduce(
        topology.scaleout.supernodes,
        SHARD,
        nodes=len(topology.nodes),
        algorithm=algorithm,
        profile=profile,
    )
    assert flows.seconds == pytest.approx(closed.seconds, rel=TOLERANCE)
    return flows.seconds, closed.seconds


@pytest.mark.parametrize("algorithm", sorted(CROSS_ALGORITHMS))
@pytest.mark.parametrize("preset", ["cm-minix2", "cm-minix3", "cm-minix4"])
@pytest.mark.parametrize(("leaf", "spine"), [(1.0, 1.0), (2.0, 1.0), (1.0, 3.0), (2.0, 2.0)])
def test_the_closed_form_agrees_with_the_flow_simulator_on_the_plane(
    preset: str, algorithm: str, leaf: float, spine: float
) -> None:
    _agree(preset, algorithm, _profile(leaf, spine))


@pytest.mark.parametrize("algorithm", sorted(CROSS_ALGORITHMS))
def test_the_closed_form_agrees_on_two_full_supernodes(algorithm: str) -> None:
    _agree("cm384x2", algorithm, DEFAULT_PROFILE)  # 1,536 dies, 48 leaves, 16 spines


@pytest.mark.parametrize("tier", ["leaf", "spine"])
def test_oversubscription_makes_the_cross_phase_and_linearity_worse(
    tier: str, mini: SupernodeStep
) -> None:
    flowsim, closed, linearity = [], [], []
    for x in (1.0, 2.0, 4.0):
        profile = _profile(**{tier: x})
        f, c = _agree("cm-minix4", "ring", profile)
        flowsim.append(f)
        closed.append(c)
        linearity.append(scaleout_step(mini, 26, profile=profile).linearity)
    assert flowsim[0] < flowsim[1] < flowsim[2]
    assert closed[0] < closed[1] < closed[2]
    assert linearity[0] > linearity[1] > linearity[2]


def test_a_die_gets_its_port_unless_a_tier_is_oversubscribed() -> None:
    port = DEFAULT_PROFILE.npu.rdma_bytes_per_s_per_die * DEFAULT_PROFILE.scaleout.efficiency
    assert cross_die_bytes_per_s(48) == pytest.approx(port)
    assert cross_die_bytes_per_s(48, _profile(leaf=2)) == pytest.approx(port / 2)
    assert cross_die_bytes_per_s(2, _profile(spine=2)) == pytest.approx(port / 2)
    assert cross_die_bytes_per_s(48, _profile(leaf=2, spine=3)) == pytest.approx(port / 6)


def test_the_algorithm_is_chosen_by_size_and_latency_grows_with_log_n() -> None:
    small, big = 64e3, 1e9
    assert cross_allreduce(432, small, nodes=48).algorithm == "halving-doubling"
    assert cross_allreduce(26, big, nodes=48).algorithm == "ring"  # HD pays 2 full extra rounds
    for k in range(1, 9):
        hd = cross_allreduce(2**k, small, nodes=48, algorithm="halving-doubling")
        ring = cross_allreduce(2**k, small, nodes=48, algorithm="ring")
        assert hd.steps == 2 * k and ring.steps == 2 * (2**k - 1)
        assert hd.bytes_per_die == pytest.approx(ring.bytes_per_die)  # both bandwidth-optimal
    odd = cross_allreduce(432, small, nodes=48, algorithm="halving-doubling")
    assert odd.steps == 2 * 8 + 2  # 256 in halving-doubling, 176 folded in and out
    auto = cross_allreduce(108, big, nodes=48)
    assert auto.seconds == min(
        cross_allreduce(108, big, nodes=48, algorithm=a).seconds for a in CROSS_ALGORITHMS
    )


def test_one_supernode_serial_is_exactly_the_existing_step_model(mini: SupernodeStep) -> None:
    topology = build("cm-mini")
    shape = shape_of(name="x", npus=16)
    existing = ModelTimer(topology).step(shape, first_dies(topology, 16, DEFAULT_PROFILE))
    one = scaleout_step(mini, 1, overlap=False)
    assert one.step_s == pytest.approx(existing.total_s)
    assert one.allreduce_s == pytest.approx(existing.allreduce_s)
    assert one.compute_s == existing.compute_s
    assert one.linearity == 1.0 and one.cross_s == 0 and one.algorithm == ""


def test_the_hierarchical_bucket_is_in_supernode_collectives_plus_the_cross_phase(
    mini: SupernodeStep,
) -> None:
    step = scaleout_step(mini, 8)
    cross = cross_allreduce(8, mini.bucket_bytes / mini.dp, nodes=mini.nodes)
    assert step.cross_s == cross.seconds and step.algorithm == cross.algorithm
    assert step.bucket_s == mini.reduce_scatter_s + cross.seconds + mini.all_gather_s
    assert step.npus == 8 * 16
    assert step.tokens_per_s == pytest.approx(8 * mini.tokens / step.step_s)


@pytest.mark.parametrize("overlap", [True, False])
def test_linearity_falls_with_supernodes_and_throughput_still_grows(
    mini: SupernodeStep, overlap: bool
) -> None:
    steps = [scaleout_step(mini, n, overlap=overlap) for n in (1, 2, 8, 26, 108, 432)]
    linearity = [s.linearity for s in steps]
    assert linearity[0] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(linearity))
    assert all(0 < x <= 1 for x in linearity)
    assert all(a.tokens_per_s < b.tokens_per_s for a, b in itertools.pairwise(steps))
    for s in steps:
        assert s.linearity == pytest.approx(steps[0].step_s / s.step_s)


def test_overlap_hides_buckets_behind_the_backward_pass() -> None:
    assert exposed_allreduce_s(0, 1.0, 5.0, overlap=True) == 0.0
    assert exposed_allreduce_s(10, 0.01, 5.0, overlap=False) == pytest.approx(0.1)
    # short buckets: only the last one, ready at the end of the backward pass, sticks out
    assert exposed_allreduce_s(10, 0.01, 5.0, overlap=True) == pytest.approx(0.01)
    # long ones: the first is ready after 1/10 of it, the rest queue behind it
    assert exposed_allreduce_s(10, 1.0, 5.0, overlap=True) == pytest.approx(0.5 + 10 - 5)


def test_a_job_without_data_parallel_ranks_inside_gets_them_across() -> None:
    whole_ep = supernode_step("cm-minix2", expert_parallel=32)  # EP over all 32 dies: DP 1 inside
    assert whole_ep.dp == 1 and whole_ep.buckets > 0 and whole_ep.allreduce_bucket_s == 0
    one, two = scaleout_step(whole_ep, 1), scaleout_step(whole_ep, 2)
    assert one.allreduce_s == 0 and two.cross_s > 0 and two.linearity < 1
    assert two.reduce_scatter_s == two.all_gather_s == 0


def test_bad_inputs_are_refused(mini: SupernodeStep) -> None:
    for n in (0, 433):
        with pytest.raises(InvalidArgumentError, match=r"supernodes must be 1\.\.432"):
            scaleout_step(mini, n)
    with pytest.raises(InvalidArgumentError, match="unknown cross-supernode algorithm 'tree'"):
        scaleout_step(mini, 2, algorithm="tree")
    for bad in (0.5, math.nan, math.inf):
        with pytest.raises(InvalidArgumentError, match="oversubscription must be >= 1"):
            with_oversubscription(DEFAULT_PROFILE, spine=bad)
    with pytest.raises(InvalidArgumentError, match="433 supernodes exceed the 432"):
        preset_supernodes("cm384x433")
    with pytest.raises(NotFoundError, match="unknown preset 'nope'"):
        preset_supernodes("nope")
    assert preset_supernodes("cm384").supernodes == 1
    with pytest.raises(InvalidArgumentError, match="no scale-out plane"):
        PlaneRoutes(build("cm-mini"))
