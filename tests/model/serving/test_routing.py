"""The kv-aware router weighs prefix overlap against load (issue 23, item 5): on one shared
prefix it spreads the work and its TTFT is no worse than round-robin's; with the overlap given
infinite weight the pile-up onto one instance comes back (so the fairness check can fail)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from bench.serving_issue23 import shared_prefix
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.des import Simulation, simulate
from cmemu.emulator.model.serving.router import RouteWeights, prefill_cost

ROOT = Path(__file__).resolve().parents[3]
BLOCK = DEFAULT_PROFILE.serving.block_tokens
INSTANCES = 6  # the published layout's prefill instances
SLACK = 1.0  # an instance may take up to twice its fair share


def _weights(**kw: float) -> RouteWeights:
    args: dict[str, float] = {
        "overlap": 1.0,
        "shared_credit": 0.9,
        "balance_abs_blocks": 32.0,
        "balance_rel": 1.5,
    }
    args.update(kw)
    return RouteWeights(block_tokens=BLOCK, batch_tokens=16384, **args)


def test_the_cost_weighs_blocks_saved_against_the_load() -> None:
    w = _weights()
    prompt = 16 * BLOCK

    def cost(cached: int, load_blocks: float, shared: int = 0) -> float:
        return prefill_cost(
            input_tokens=prompt,
            cached_blocks=cached,
            load_tokens=load_blocks * BLOCK,
            w=w,
            shared_blocks=shared,
        )[0]

    idle = cost(0, 0)
    assert idle == 16
    assert cost(14, 4) < idle  # holding 14 blocks beats an idle instance behind 4 blocks
    assert cost(14, 20) > idle  # not behind 20
    # a block EMS holds saves most of its prefill anywhere: the one in HBM only the load
    assert cost(14, 0, shared=14) == pytest.approx(2)
    assert cost(0, 0, shared=14) == pytest.approx(16 - 0.9 * 14)
    inf = _weights(overlap=float("inf"))
    behind = prefill_cost(input_tokens=prompt, cached_blocks=14, load_tokens=1e9, w=inf)
    fresh = prefill_cost(input_tokens=prompt, cached_blocks=0, load_tokens=0.0, w=inf)
    assert behind < fresh  # infinite weight: affinity whatever the queue


@pytest.mark.parametrize(
    "bad",
    [{"overlap": -1.0}, {"shared_credit": 1.5}, {"balance_rel": 0.5}, {"balance_abs_blocks": -1}],
)
def test_bad_router_weights_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(InvalidArgumentError, match="router weights"):
        _weights(**bad)


def _run(router: str, profile: HardwareProfile = DEFAULT_PROFILE) -> Simulation:
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())
    doc["router"] = router
    deployment = parse_deployment(doc)
    assert deployment.prefill.instances == INSTANCES
    return simulate(deployment, shared_prefix(), profile=profile)


def _busiest_share(sim: Simulation) -> float:
    counts = sim.engine.stats.prefill_requests
    return max(counts.values()) / sum(counts.values())


@pytest.fixture(scope="module")
def round_robin() -> Simulation:
    return _run("round-robin")


def test_kv_routing_spreads_a_shared_prefix_and_is_no_slower(round_robin: Simulation) -> None:
    kv = _run("kv-aware")
    fair = 1 / INSTANCES
    share = _busiest_share(kv)
    assert share <= fair * (1 + SLACK), (share, kv.engine.stats.prefill_requests)
    assert len(kv.engine.stats.prefill_requests) == INSTANCES  # none left idle
    assert kv.report.finished == round_robin.report.finished == len(shared_prefix())
    assert kv.report.ttft_s.p50 <= round_robin.report.ttft_s.p50
    assert kv.report.ttft_s.p90 <= round_robin.report.ttft_s.p90


def test_infinite_overlap_weight_piles_onto_one_instance(round_robin: Simulation) -> None:
    """The case that must fail the fairness check: affinity whatever the load."""
    greedy = dataclasses.replace(
        DEFAULT_PROFILE,
        serving=dataclasses.replace(DEFAULT_PROFILE.serving, router_overlap_weight=float("inf")),
    )
    piled = _run("kv-aware", greedy)
    share = _busiest_share(piled)
    assert share > (1 / INSTANCES) * (1 + SLACK), piled.engine.stats.prefill_requests
    assert share > 0.9
    assert piled.report.ttft_s.p50 > round_robin.report.ttft_s.p50 * 1.3


def _router_figures(overlap: float, balance_abs_blocks: float) -> HardwareProfile:
    serving = dataclasses.replace(
        DEFAULT_PROFILE.serving,
        router_overlap_weight=overlap,
        router_balance_abs_blocks=balance_abs_blocks,
    )
    return dataclasses.replace(DEFAULT_PROFILE, serving=serving)


def test_the_balance_fallback_bounds_a_heavy_affinity() -> None:
    """A finite but overwhelming overlap weight piles up until the busiest instance is more than
    `router_balance_abs_blocks` ahead (and `router_balance_rel` times the idlest): then the least
    loaded takes the request. Here a batch in flight is a few blocks, so a threshold of 2 blocks
    shows it; an unreachable one lets everything pile up."""
    bounded = _busiest_share(_run("kv-aware", _router_figures(1e9, 2.0)))
    unbounded = _busiest_share(_run("kv-aware", _router_figures(1e9, 1e12)))
    assert unbounded > 0.9
    assert bounded < unbounded - 0.2
