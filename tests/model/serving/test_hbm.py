"""A die's HBM is finite (issue 23 item 2): weights, KV caches and activations must fit it; the
engine never runs a decode batch that does not fit, and the largest batch is an output."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.overrides import apply_overrides
from cmemu.emulator.model.serving import hbm
from cmemu.emulator.model.serving.cost import kv_bytes_per_token
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.des import simulate
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.workload import generate, parse_workload

ROOT = Path(__file__).resolve().parents[3]
MODEL = get_model("deepseek-r1")
CONTEXT = 4096 + 256


def test_the_published_decode_die_holds_its_batch_with_room_to_spare() -> None:
    die = hbm.die_memory(MODEL, 320, mtp=True)
    # INT8: 62 layers of attention, 3 dense FFNs, one expert slot of 59 MoE layers, embedding and
    # head: about 17 GB of the die's 64 GiB
    assert 16e9 < die.weights_bytes < 18.5e9
    assert die.request_bytes(CONTEXT) == pytest.approx(
        CONTEXT * 61 * 576 + 2 * hbm.activation_bytes_per_token(MODEL)
    )
    batch = die.max_batch(CONTEXT)
    assert 48 < batch < 1024  # the published 48 fits; the 1,024 does not
    assert batch * die.request_bytes(CONTEXT) <= die.free_bytes
    assert (batch + 1) * die.request_bytes(CONTEXT) > die.free_bytes


def test_more_experts_per_die_and_a_wider_kv_leave_fewer_requests() -> None:
    ep320 = hbm.die_memory(MODEL, 320, mtp=True).max_batch(CONTEXT)
    ep32 = hbm.die_memory(MODEL, 32, mtp=True).max_batch(CONTEXT)
    assert ep32 < ep320 * 0.6  # ten expert slots per die instead of one
    bf16 = apply_overrides(DEFAULT_PROFILE, {"serving.kv_bytes_per_element": 2})
    assert kv_bytes_per_token(MODEL, bf16) == 2 * kv_bytes_per_token(MODEL)
    assert hbm.die_memory(MODEL, 320, mtp=True, profile=bf16).max_batch(CONTEXT) < ep320 * 0.55


def test_weights_that_do_not_fit_are_named() -> None:
    tiny = apply_overrides(DEFAULT_PROFILE, {"npu.hbm_bytes_per_die": 16e9})
    die = hbm.die_memory(MODEL, 320, mtp=True, profile=tiny)
    assert die.max_batch(CONTEXT) == 0
    with pytest.raises(InvalidArgumentError, match=r"a decode die's weights \(17\.\d GB\)"):
        hbm.check_weights_fit(die, "decode")
    hbm.check_weights_fit(hbm.die_memory(MODEL, 320, mtp=True), "decode")  # the default fits


def _deployment(max_batch: int = 1024) -> Deployment:
    return parse_deployment(
        {
            "preset": "cm384",
            "decode": {"npus": 16, "ep": 32, "max_batch_per_die": max_batch},
            "prefill": {"instances": 3, "npus": 16, "ep": 32},
            "router": "round-robin",
        }
    )


def _requests(rate: float = 300, seconds: float = 8) -> list[Request]:
    doc = {"input": 1024, "output": 4096, "rate_per_s": rate, "duration_s": seconds, "seed": 2}
    return list(generate(parse_workload(doc), block_tokens=512))


@pytest.mark.parametrize("hbm_bytes", [50e9, 53e9])
def test_a_batch_that_does_not_fit_is_never_run(hbm_bytes: float) -> None:
    profile = apply_overrides(DEFAULT_PROFILE, {"npu.hbm_bytes_per_die": hbm_bytes})
    die = hbm.die_memory(MODEL, 32, mtp=True, profile=profile)
    bound = die.max_batch(1024 + 4096)
    assert 10 < bound < 100
    report = simulate(_deployment(), _requests(), duration_s=8, profile=profile).report
    # more requests arrive than fit: the batch stops at the HBM bound, never above it
    assert report.prefill_tokens / 1024 > bound * 32
    assert report.batch_per_die_max == bound == report.hbm_batch_per_die
    assert report.hbm_waits > 0 and report.hbm_refused == 0
    assert report.hbm_peak_bytes_per_die <= hbm_bytes == report.hbm_bytes_per_die
    assert report.hbm_weights_fit


def test_the_slot_cap_binds_when_it_is_below_the_hbm_bound() -> None:
    # the twin: the same load with a cap of 8 per die stops at 8 and never waits for HBM
    report = simulate(_deployment(max_batch=8), _requests(), duration_s=8).report
    assert report.batch_per_die_max == 8 < report.hbm_batch_per_die
    assert report.hbm_waits == 0


def test_a_request_whose_kv_alone_overflows_a_die_fails_with_the_reason() -> None:
    profile = apply_overrides(DEFAULT_PROFILE, {"npu.hbm_bytes_per_die": 46e9})
    free = hbm.die_memory(MODEL, 32, mtp=True, profile=profile).free_bytes
    context = int(free / kv_bytes_per_token(MODEL)) + 1024  # more KV than the die has left
    big = Request(id="big", arrival_s=0.0, input_tokens=context - 16, output_tokens=16)
    ok = Request(id="ok", arrival_s=0.1, input_tokens=1024, output_tokens=16)
    sim = simulate(_deployment(), [big, ok], profile=profile, stream_tokens=True)
    assert sim.report.hbm_refused == 1 and sim.report.finished == 1
    assert sim.engine.stats.failed == 1
    assert "exceeds a decode die's free HBM" in sim.recorder.errors["big"]
    assert "ok" in sim.recorder.finish


def test_a_toy_layout_whose_weights_overflow_is_not_held_to_hbm() -> None:
    # cm-mini's small deployment (EP16: 20 expert slots per die) cannot hold DeepSeek-R1 in 64
    # GiB; it runs (the live tests need it) and the report says HBM was not enforced
    doc = yaml.safe_load((ROOT / "examples/deployments/small.yaml").read_text())
    report = simulate(parse_deployment(doc), _requests(rate=2, seconds=3)[:6]).report
    assert not report.hbm_weights_fit and report.hbm_batch_per_die == 0
    assert report.finished == 6
