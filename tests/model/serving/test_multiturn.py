"""Caching with its real costs (issue 23, item 4), on multi-turn conversations: each turn's prompt
is the conversation so far, so with EMS a turn prefills only its new text (but attends over the
whole context, so its TTFT still grows with the turn), and without EMS it prefills everything
again; a prefix block not in the prefill instance's HBM is read from the pool over UB, which a
slow pool makes visible."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.des import simulate
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.workload import generate, parse_workload, turn_of

ROOT = Path(__file__).resolve().parents[3]
BLOCK = DEFAULT_PROFILE.serving.block_tokens
TURNS = 8


def _conversations(**kw: Any) -> list[Request]:
    doc: dict[str, Any] = {
        "input": 2048,
        "output": 256,
        "rate_per_s": 1,
        "duration_s": 30,
        "turns": TURNS,
        "turn_gap_s": 20,
        "seed": 3,
    }
    doc.update(kw)
    return list(generate(parse_workload(doc), block_tokens=BLOCK))


def test_a_turn_is_the_conversation_so_far_plus_new_text() -> None:
    requests = _conversations(rate_per_s=0.1, duration_s=10)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    first = [r for r in requests if r.id.startswith("c0.")]
    assert [turn_of(r.id) for r in first] == list(range(TURNS))
    for before, after in itertools.pairwise(first):
        assert after.input_tokens == before.input_tokens + before.output_tokens + 2048
        assert after.arrival_s - before.arrival_s == pytest.approx(20)
        # the earlier prompt's blocks lead the later one's: a prefix cache can hit on them
        assert after.block_keys[: len(before.block_keys)] == before.block_keys
    assert turn_of("r3") is None and turn_of("c1.x") is None


@pytest.mark.parametrize(
    ("field", "value"), [("turns", 0), ("turns", 1.5), ("turn_gap_s", 0), ("turn_gap_s", -1)]
)
def test_bad_turn_fields_are_refused(field: str, value: float) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        parse_workload({field: value})


def _ttft_by_turn(
    *, ems: bool, router: str = "kv-aware", profile: HardwareProfile = DEFAULT_PROFILE
) -> list[float]:
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())
    doc["ems"] = {"enabled": ems}
    doc["router"] = router
    sim = simulate(parse_deployment(doc), _conversations(), profile=profile)
    assert sim.report.finished == sim.report.submitted
    rec = sim.recorder
    by: dict[int, list[float]] = defaultdict(list)
    for rid, t in rec.first.items():
        turn = turn_of(rid)
        assert turn is not None
        by[turn].append(t - rec.arrival[rid])
    medians = [statistics.median(by[k]) for k in range(TURNS)]
    assert sim.report.ttft_p50_s_by_turn == pytest.approx(medians)  # what the CLI prints
    return medians


@pytest.fixture(scope="module")
def with_ems() -> list[float]:
    return _ttft_by_turn(ems=True)


def test_ems_cuts_later_turns_ttft(with_ems: list[float]) -> None:
    without = _ttft_by_turn(ems=False)
    assert without[0] == pytest.approx(with_ems[0], rel=0.05)  # nothing to reuse yet
    assert without[-1] > without[0] * 2  # the whole conversation prefilled again
    assert with_ems[-1] < without[-1] * 0.6
    # the suffix attends over the whole cached context: it still costs more as it grows
    assert with_ems[-1] > with_ems[0] * 1.1


def _no_prefill_hbm(ub_bytes_per_s: float | None = None) -> HardwareProfile:
    p = DEFAULT_PROFILE
    rate = p.ub.achieved_bytes_per_s_per_die if ub_bytes_per_s is None else ub_bytes_per_s
    return dataclasses.replace(
        p,
        serving=dataclasses.replace(p.serving, prefill_prefix_bytes_per_die=0),
        ub=dataclasses.replace(p.ub, achieved_bytes_per_s_per_die=rate),
    )


def test_loading_from_the_pool_is_mostly_hidden_unless_the_pool_is_slow(
    with_ems: list[float],
) -> None:
    """Every hit read from EMS (no prefill HBM keeps blocks): at UB bandwidth the layer-by-layer
    load hides behind the forward pass; at 1/200 of it the load shows."""
    from_pool = _ttft_by_turn(ems=True, profile=_no_prefill_hbm())
    assert from_pool[-1] == pytest.approx(with_ems[-1], rel=0.05)
    assert from_pool[-1] >= with_ems[-1]
    ub = DEFAULT_PROFILE.ub.achieved_bytes_per_s_per_die
    slow = _ttft_by_turn(ems=True, profile=_no_prefill_hbm(ub / 200))
    assert slow[-1] > from_pool[-1] * 1.3
