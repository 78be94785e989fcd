"""Decode HBM admission (issue 23 item 2): `reserve` holds a request's final context from the
start and never preempts; `on-demand` holds its context so far, grows it every step, and
preempts the newest requests of a die that outgrows its budget (recomputed: prefilled again
over their prompt and the tokens they had, then decoded on). On an HBM-bound deployment
on-demand runs larger batches and more tokens per second, and every request still finishes with
all of its tokens; with HBM to spare the two are the same run (its twin): the difference is the
memory bound, not the policy's name. Neither ever holds more than a die's HBM."""

from __future__ import annotations

from typing import Any

import pytest

from cmemu.emulator.model.errors import UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.overrides import apply_overrides
from cmemu.emulator.model.serving.deployment import parse_deployment
from cmemu.emulator.model.serving.des import Simulation, simulate
from cmemu.emulator.model.serving.workload import generate, parse_workload

TIGHT = 46e9  # a die's HBM: weights and reserve leave room for about 9 requests of 3,072 tokens
AMPLE = 64e9  # the real die: room for about 175


def _doc(admission: str) -> dict[str, Any]:
    return {
        "model": "deepseek-r1",
        "preset": "cm384",
        "decode": {"npus": 16, "max_batch_per_die": 256, "admission": admission},
        "prefill": {"instances": 2, "npus": 16},
    }


def _run(admission: str, hbm: float) -> Simulation:
    profile = apply_overrides(DEFAULT_PROFILE, {"npu.hbm_bytes_per_die": hbm})
    workload = parse_workload(
        {"version": 1, "input": 2048, "output": 1024, "arrival": "poisson",
         "rate_per_s": 60, "duration_s": 8, "seed": 1}
    )  # fmt: skip
    requests = list(generate(workload, block_tokens=profile.serving.block_tokens))
    return simulate(parse_deployment(_doc(admission), profile), requests, profile=profile)


def _all_tokens(sim: Simulation) -> None:
    """Every request finished, none failed, each with every output token it asked for."""
    r = sim.recorder
    assert r.failed == 0 and r.cancelled == 0
    assert len(r.finish) == sim.report.submitted
    assert all(tokens == 1024 for _, tokens in r.finish.values())


def test_on_demand_runs_larger_batches_preempting_the_newest_and_loses_no_token() -> None:
    reserve, on_demand = _run("reserve", TIGHT), _run("on-demand", TIGHT)
    r, o = reserve.report, on_demand.report
    assert r.hbm_batch_per_die < 12 and r.hbm_waits > 0  # bound by HBM, not by max_batch
    assert r.preemptions == 0 and r.batch_per_die_max <= r.hbm_batch_per_die
    assert o.preemptions > 0 and o.preempted_tokens > o.preemptions * 2048
    assert o.batch_per_die_max >= r.batch_per_die_max * 1.3
    assert o.tokens_per_s > r.tokens_per_s * 1.02
    for sim in (reserve, on_demand):
        _all_tokens(sim)
        assert sim.report.hbm_peak_bytes_per_die <= TIGHT  # never more than the die holds


def test_its_twin_with_hbm_to_spare_is_the_same_run() -> None:
    reserve, on_demand = _run("reserve", AMPLE).report, _run("on-demand", AMPLE).report
    assert on_demand.preemptions == 0 and reserve.hbm_waits == on_demand.hbm_waits == 0
    assert on_demand.batch_per_die_max == reserve.batch_per_die_max
    assert on_demand.tokens_per_s == pytest.approx(reserve.tokens_per_s, rel=1e-9)


def test_an_unknown_admission_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="on-demand") as err:
        parse_deployment(_doc("optimistic"))
    assert err.value.field == "decode.admission"
