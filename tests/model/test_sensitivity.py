"""Model mode obeys the hardware (issue 23 item 7): each figure a what-if changes moves the answer
in the physical direction, by a non-trivial amount. Every figure goes in as the CLI's `--set` does
(parse_override, apply_overrides) and comes out of what the CLI prints: the decode step and its
collectives of the simulator's decode instance (operating.DecodeCurve, what --slo-tpot searches),
the HBM bound, and the simulator's report.

Each effect has a twin that must not move: the same question asked of a figure that plays no
part in it, so a test cannot pass because everything moves at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.overrides import apply_overrides, parse_override
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.des import simulate
from cmemu.emulator.model.serving.operating import DecodeCurve
from cmemu.emulator.model.serving.workload import generate, parse_workload

ROOT = Path(__file__).resolve().parents[2]
SMALL_BATCH = 1
PUBLISHED_BATCH = 48


def _what_if(*sets: str) -> HardwareProfile:
    return apply_overrides(DEFAULT_PROFILE, [parse_override(s) for s in sets])


def _deployment(**changes: object) -> Deployment:
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())
    doc.update(changes)
    return parse_deployment(doc)


def _curve(*sets: str, platform: str = "cm384") -> DecodeCurve:
    return DecodeCurve(
        _deployment(platform=platform),
        prompt_tokens=4096,
        output_tokens=256,
        profile=_what_if(*sets) if sets else DEFAULT_PROFILE,
    )


def _change(before: float, after: float) -> float:
    return after / before - 1


# --- HBM bandwidth: memory-bound decode gets faster ----------------------------------------------


def test_more_hbm_bandwidth_makes_small_batch_decode_faster() -> None:
    base, fast = _curve(), _curve("npu.hbm_bytes_per_s_per_die=3.2e12")
    # at one request per die every kernel is memory-bound: its time halves with the bandwidth
    kernels = _change(base.step(SMALL_BATCH).compute_s, fast.step(SMALL_BATCH).compute_s)
    assert kernels == pytest.approx(-0.5, abs=0.02)
    # the step's fixed overheads stay (issue 23 item 1 refits them): TPOT falls by over 5%
    assert _change(base.tpot_s(SMALL_BATCH), fast.tpot_s(SMALL_BATCH)) < -0.05
    assert _change(base.tpot_s(PUBLISHED_BATCH), fast.tpot_s(PUBLISHED_BATCH)) < -0.10
    # the twin: HBM capacity plays no part in a step's time
    roomy = _curve("npu.hbm_bytes_per_die=128e9")
    assert roomy.tpot_s(SMALL_BATCH) == base.tpot_s(SMALL_BATCH)


def test_more_hbm_bandwidth_shows_in_the_simulated_tpot() -> None:
    doc = {"input": 4096, "output": 64, "rate_per_s": 20, "duration_s": 4, "seed": 3}
    requests = list(generate(parse_workload(doc), block_tokens=512))
    d = _deployment()
    base = simulate(d, requests, profile=DEFAULT_PROFILE).report
    fast = simulate(d, requests, profile=_what_if("npu.hbm_bytes_per_s_per_die=3.2e12")).report
    assert base.batch_per_die_max <= 2  # small batches: memory-bound
    assert _change(base.tpot_s.p50, fast.tpot_s.p50) < -0.05
    assert fast.overrides == {"npu.hbm_bytes_per_s_per_die": 3.2e12}


# --- HBM capacity: a smaller largest batch -------------------------------------------------------


def test_less_hbm_capacity_gives_a_smaller_largest_batch() -> None:
    base = _curve()
    small = _curve(f"npu.hbm_bytes_per_die={0.75 * DEFAULT_PROFILE.npu.hbm_bytes_per_die}")
    # a quarter of 64 GiB off a die whose weights and reserve take 21.5 GB: over a third fewer
    assert _change(base.hbm_batch, small.hbm_batch) < -0.3
    # a wider KV cache (BF16) also leaves fewer requests
    assert _change(base.hbm_batch, _curve("serving.kv_bytes_per_element=2").hbm_batch) < -0.45
    # the twin: HBM bandwidth does not change what fits
    assert _curve("npu.hbm_bytes_per_s_per_die=3.2e12").hbm_batch == base.hbm_batch


# --- the fabric: slower switch ports and UB make EP dispatch slower ------------------------------


@pytest.mark.parametrize(
    "figure",
    [
        f"switch.port_bytes_per_s={DEFAULT_PROFILE.switch.port_bytes_per_s / 4}",
        f"ub.achieved_bytes_per_s_per_die={DEFAULT_PROFILE.ub.achieved_bytes_per_s_per_die / 4}",
        f"npu.ub_port_bytes_per_s={DEFAULT_PROFILE.npu.ub_port_bytes_per_s / 4}",
    ],
)
def test_slower_ports_make_ep_dispatch_slower(figure: str) -> None:
    base, slow = _curve(), _curve(figure)
    (d0, c0), (d1, c1) = base.moe_s(PUBLISHED_BATCH), slow.moe_s(PUBLISHED_BATCH)
    # EP320, 48 tokens per rank: the transfer part grows fourfold, the software part stays
    assert _change(d0, d1) > 0.3
    assert _change(c0, c1) > 0.8
    assert slow.tpot_s(PUBLISHED_BATCH) > base.tpot_s(PUBLISHED_BATCH)


def test_faster_die_ports_make_ep_dispatch_faster_and_compute_does_not() -> None:
    base = _curve()
    ub = DEFAULT_PROFILE.ub.achieved_bytes_per_s_per_die
    fast = _curve(f"ub.achieved_bytes_per_s_per_die={ub * 2}")
    assert fast.moe_s(PUBLISHED_BATCH)[1] < base.moe_s(PUBLISHED_BATCH)[1] * 0.85
    # faster switch ports alone do not help: the dies' own UB ports are the bottleneck
    switch = _curve(f"switch.port_bytes_per_s={DEFAULT_PROFILE.switch.port_bytes_per_s * 4}")
    assert switch.moe_s(PUBLISHED_BATCH) == base.moe_s(PUBLISHED_BATCH)
    # the twin: compute peak is not part of a collective
    peak = _curve("npu.peak_ops_per_s_per_die.INT8=1.5e15")
    assert peak.moe_s(PUBLISHED_BATCH) == base.moe_s(PUBLISHED_BATCH)


def test_a_slower_rdma_plane_costs_more_on_cluster_roce_than_on_cm384() -> None:
    slower = f"npu.rdma_bytes_per_s_per_die={DEFAULT_PROFILE.npu.rdma_bytes_per_s_per_die / 4}"
    roce, roce_slow = _curve(platform="cluster-roce"), _curve(slower, platform="cluster-roce")
    assert _change(roce.moe_s(PUBLISHED_BATCH)[0], roce_slow.moe_s(PUBLISHED_BATCH)[0]) > 1.0
    assert _change(roce.tpot_s(PUBLISHED_BATCH), roce_slow.tpot_s(PUBLISHED_BATCH)) > 0.5
    # the twin: on cm384 the MoE traffic never leaves UB, so the RDMA plane does not matter
    assert _curve(slower).tpot_s(PUBLISHED_BATCH) == _curve().tpot_s(PUBLISHED_BATCH)
    # and cluster-roce costs more than cm384 at the same batch
    assert roce.tpot_s(PUBLISHED_BATCH) > _curve().tpot_s(PUBLISHED_BATCH)


# --- compute peak: compute-bound kernels get faster ----------------------------------------------


def test_more_compute_peak_makes_the_published_batch_faster() -> None:
    base = _curve()
    fast = _curve(
        "npu.peak_ops_per_s_per_die.INT8=1.504e15", "npu.peak_ops_per_s_per_die.BF16=708e12"
    )
    assert _change(base.tpot_s(PUBLISHED_BATCH), fast.tpot_s(PUBLISHED_BATCH)) < -0.15
    # the twin: one request per die is memory- and launch-bound, so twice the peak barely moves it
    assert abs(_change(base.tpot_s(SMALL_BATCH), fast.tpot_s(SMALL_BATCH))) < 0.02


def test_the_die_ports_reach_the_collectives_and_the_calibration_stays() -> None:
    # the ports are what a user changes for "UB bandwidth": a quarter of their rate slows EP
    # dispatch, as the calibrated achieved rate does (the protocol's efficiency, 167 of 196
    # GB/s, stays; taken against the what-if's own ports it used to cancel them: no effect)
    port = DEFAULT_PROFILE.npu.ub_port_bytes_per_s
    base, slow = _curve(), _curve(f"npu.ub_port_bytes_per_s={port / 4}")
    assert _change(base.moe_s(PUBLISHED_BATCH)[1], slow.moe_s(PUBLISHED_BATCH)[1]) > 0.8
    assert _change(base.tpot_s(PUBLISHED_BATCH), slow.tpot_s(PUBLISHED_BATCH)) > 0.01
    # the twin: the published ports are the ones the UB rows were measured on, so at the
    # default nothing moves (the calibration tests hold the rest)
    npu, ub = DEFAULT_PROFILE.npu, DEFAULT_PROFILE.ub
    assert ub.measured_on_bytes_per_s_per_die == npu.ub_ports_per_die * npu.ub_port_bytes_per_s
    same = _curve(f"npu.ub_port_bytes_per_s={port}")
    assert same.moe_s(PUBLISHED_BATCH) == base.moe_s(PUBLISHED_BATCH)
