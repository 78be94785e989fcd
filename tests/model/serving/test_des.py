"""The discrete-event simulator: deterministic for a seed, and its figures move the right way
with prefix reuse, EMS, load and platform."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.des import simulate
from cmemu.emulator.model.serving.workload import generate, parse_workload, read_mooncake

ROOT = Path(__file__).resolve().parents[3]
BLOCK = 512


def _small(**changes: object) -> Deployment:
    doc = yaml.safe_load((ROOT / "examples/deployments/small.yaml").read_text())
    doc.update(changes)
    return parse_deployment(doc)


def _workload(**changes: object) -> list:  # type: ignore[type-arg]
    doc = {
        "input": {"kind": "uniform", "low": 1000, "high": 4000},
        "output": 24,
        "rate_per_s": 4,
        "prefix_reuse": 0.5,
        "prefix_pool": 4,
        "duration_s": 30,
        "seed": 5,
    }
    doc.update(changes)
    return list(generate(parse_workload(doc), block_tokens=BLOCK))


def test_the_same_seed_gives_the_same_report() -> None:
    a = simulate(_small(), _workload()).report.to_dict()
    b = simulate(_small(), _workload()).report.to_dict()
    c = simulate(_small(), _workload(seed=6)).report.to_dict()
    assert a == b
    assert a != c


def test_every_request_finishes_when_run_to_the_end() -> None:
    requests = _workload()
    report = simulate(_small(), requests).report
    assert report.submitted == report.finished == len(requests)
    assert report.output_tokens == 24 * len(requests)
    assert report.batch_per_die_max <= 2
    assert report.ttft_s.p50 > 0 and report.tpot_s.p50 > 0
    assert report.ttft_s.p50 <= report.ttft_s.p90 <= report.ttft_s.p99


def test_a_duration_stops_the_run() -> None:
    requests = _workload(duration_s=60)
    sim = simulate(_small(), requests, duration_s=10)
    assert sim.report.emulated_s == 10
    assert sim.report.submitted == sum(r.arrival_s <= 10 for r in requests)
    assert sim.report.finished < sim.report.submitted


def test_prefix_reuse_hits_in_ems_and_shortens_prefill() -> None:
    reuse = {r: simulate(_small(), _workload(prefix_reuse=r)).report for r in (0.0, 0.5, 0.9)}
    assert reuse[0.0].kv_hit_rate == 0
    assert 0.3 < reuse[0.5].kv_hit_rate < reuse[0.9].kv_hit_rate
    assert reuse[0.9].prefill_tokens < reuse[0.5].prefill_tokens < reuse[0.0].prefill_tokens
    # a hit's blocks come from the prefill instance's HBM while it holds them, else from EMS
    assert reuse[0.9].prefill_hbm_hit_blocks > 0
    no_hbm = dataclasses.replace(
        DEFAULT_PROFILE,
        serving=dataclasses.replace(DEFAULT_PROFILE.serving, prefill_prefix_bytes_per_die=0),
    )
    loaded = simulate(_small(), _workload(prefix_reuse=0.9), profile=no_hbm).report
    assert loaded.ems_loaded_bytes > 0 and loaded.prefill_hbm_hit_blocks == 0
    assert loaded.kv_hit_rate == reuse[0.9].kv_hit_rate
    off = simulate(_small(ems={"enabled": False}), _workload(prefix_reuse=0.9)).report
    assert off.kv_hit_rate == 0 and off.ems_loaded_bytes == 0 and off.prefill_hbm_hit_blocks == 0
    assert off.ttft_s.mean > reuse[0.9].ttft_s.mean


def test_a_small_ems_evicts() -> None:
    small = simulate(
        _small(ems={"enabled": True, "capacity_bytes": 10 * 61 * 576 * 512}),
        _workload(prefix_reuse=0.9, prefix_pool=8),
    )
    big = simulate(_small(), _workload(prefix_reuse=0.9, prefix_pool=8))
    assert small.cache.evicted > 0 == big.cache.evicted
    assert small.report.kv_hit_rate < big.report.kv_hit_rate


def test_more_load_more_throughput_and_latency() -> None:
    light = simulate(_small(), _workload(rate_per_s=1)).report
    # 16 requests/s: more in decode at once than the instance's 16 dies (at 8 they are fewer)
    heavy = simulate(_small(), _workload(rate_per_s=16)).report
    assert heavy.tokens_per_s > light.tokens_per_s
    assert heavy.batch_per_die_mean > light.batch_per_die_mean
    assert heavy.ttft_s.p90 > light.ttft_s.p90


def test_cluster_roce_is_slower_than_the_supernode() -> None:
    ub = simulate(_small(), _workload()).report
    roce = simulate(_small(platform="cluster-roce"), _workload()).report
    assert roce.tpot_s.p50 > ub.tpot_s.p50
    # the twin: the prefill instance (4 NPUs) lies inside one 8-NPU server, so its collectives
    # never leave UB on either platform and the first token comes as fast
    assert roce.ttft_s.p50 == pytest.approx(ub.ttft_s.p50, rel=1e-3)


def test_the_mooncake_trace_runs() -> None:
    lines = (ROOT / "workloads/mooncake-synthetic.jsonl").read_text().splitlines()[:200]
    requests = read_mooncake(lines, block_tokens=BLOCK)
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())
    d = parse_deployment(doc)
    report = simulate(d, requests).report
    assert report.finished == len(requests)
    assert report.kv_hit_rate > 0


@pytest.mark.parametrize("router", ["kv-aware", "prefix-aware", "round-robin"])
def test_every_router_serves_everything(router: str) -> None:
    requests = _workload()
    report = simulate(_small(router=router), requests).report
    assert report.finished == len(requests)
