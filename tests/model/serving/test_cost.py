"""The step cost model: how a decode step and a prefill batch respond to their inputs."""

from __future__ import annotations

import dataclasses

import pytest

from cmemu.emulator.model.errors import UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.models import MODELS, get_model

MODEL = get_model("deepseek-r1")
COMM = {"dispatch_s": 120e-6, "combine_s": 130e-6}


def _decode(**kw: object) -> cost.StepTime:
    args: dict[str, object] = {
        "batch_per_die": 48,
        "kv_tokens": 4096,
        "mtp": True,
        "microbatches": 2,
        "imbalance": 1.0,
        "dies": 320,
        "ep": 320,
        **COMM,
    }
    args.update(kw)
    return cost.decode_step(MODEL, **args)  # type: ignore[arg-type]


def _prefill(**kw: object) -> cost.StepTime:
    args: dict[str, object] = {
        "tokens_per_die": 512,
        "attention_pairs_per_die": 512 * 2048,
        "requests_per_die": 0.125,
        "load_s": 0.0,
        "microbatches": 2,
        "imbalance": 1.0,
        "dies": 32,
        "ep": 32,
        **COMM,
    }
    args.update(kw)
    return cost.prefill_batch(MODEL, **args)  # type: ignore[arg-type]


def test_the_model_shape_is_deepseek_r1() -> None:
    assert MODEL.layers == 61 and MODEL.moe_layers == 58
    # 576 elements per token and layer: 35 KB of INT8 KV per token over 61 layers
    assert cost.kv_bytes_per_token(MODEL) == 61 * 576
    assert MODEL.expert_params == 3 * 7168 * 2048
    assert set(MODELS) >= {"deepseek-r1"}
    with pytest.raises(UnknownNameError, match="deepseek-r1"):
        get_model("llama")


def test_decode_grows_with_batch_context_and_comm() -> None:
    base = _decode().total_s
    assert _decode(batch_per_die=96).total_s > base > _decode(batch_per_die=8).total_s
    assert _decode(kv_tokens=8192).total_s > base > _decode(kv_tokens=1024).total_s
    slower = _decode(dispatch_s=1e-3, combine_s=1e-3).total_s
    assert slower > base
    assert _decode(imbalance=1.5).total_s > base


def test_mtp_runs_two_tokens_per_request_and_the_draft_layer() -> None:
    with_mtp, without = _decode(), _decode(mtp=False)
    assert with_mtp.total_s > without.total_s
    # per output token MTP wins: 1.7 tokens per step
    per_token = with_mtp.total_s / DEFAULT_PROFILE.serving.mtp_tokens_per_step
    assert per_token < without.total_s


def test_two_microbatches_hide_communication() -> None:
    # slow collectives (RDMA-like): the caller times each microbatch's own, half as many tokens
    one = _decode(microbatches=1, dispatch_s=300e-6, combine_s=300e-6)
    two = _decode(microbatches=2, dispatch_s=180e-6, combine_s=180e-6)
    assert two.hidden_s > 0 == one.hidden_s
    assert two.total_s < one.total_s
    p1, p2 = _prefill(microbatches=1), _prefill(microbatches=2)
    assert p2.total_s < p1.total_s


def test_the_parts_add_up() -> None:
    for step in (_decode(), _prefill()):
        parts = step.compute_s + step.comm_s - step.hidden_s + step.fixed_s
        assert parts == pytest.approx(step.total_s)
        assert step.fixed_s >= DEFAULT_PROFILE.serving.graph_launch_s


def test_prefix_loads_overlap_the_forward_pass_layer_by_layer() -> None:
    base = _prefill()
    layers = MODEL.layers
    # a load shorter than the compute: only the first layer's share shows
    small = base.total_s * 0.5
    assert _prefill(load_s=small).total_s - base.total_s == pytest.approx(small / layers)
    # a load longer than the compute: the pass waits for it (plus one layer's compute)
    big = base.total_s * 4
    exposed = _prefill(load_s=big).total_s - base.total_s
    assert exposed > big * 0.5
    assert exposed < big  # still partly hidden behind the compute


def test_a_prefix_load_is_one_ub_read_per_block_from_the_pool() -> None:
    block = 512 * cost.kv_bytes_per_token(MODEL)
    one = cost.prefix_load_s(1, block, ub_across_servers=True)
    ub = DEFAULT_PROFILE.ub.achieved_bytes_per_s_per_die
    assert one > block / ub  # bandwidth plus the pool's latency and the node crossing
    assert cost.prefix_load_s(10, block, ub_across_servers=True) == pytest.approx(10 * one)
    assert cost.prefix_load_s(0, block, ub_across_servers=True) == 0.0
    # over a die's RDMA port (cluster-roce) the same blocks take longer
    assert cost.prefix_load_s(10, block, ub_across_servers=False) > 2 * 10 * one


def test_prefill_of_a_suffix_attends_over_the_cached_prefix() -> None:
    new = 512
    short = _prefill(attention_pairs_per_die=new * (1_024 + (new + 1) / 2))
    long = _prefill(attention_pairs_per_die=new * (32_768 + (new + 1) / 2))
    assert long.compute_s > short.compute_s * 1.5


def test_the_measured_utilisations_set_the_rates() -> None:
    s = DEFAULT_PROFILE.serving
    halved = dataclasses.replace(
        DEFAULT_PROFILE,
        serving=dataclasses.replace(s, mla_compute_utilisation=s.mla_compute_utilisation / 2),
    )
    slow = cost.decode_step(
        MODEL,
        batch_per_die=48,
        kv_tokens=4096,
        mtp=True,
        microbatches=2,
        imbalance=1.0,
        dies=320,
        ep=320,
        profile=halved,
        **COMM,
    )
    assert slow.compute_s > _decode().compute_s * 1.3


def test_expert_slots_follow_the_published_layouts() -> None:
    assert cost.slots_per_die(MODEL, 320) == 1
    assert cost.slots_per_die(MODEL, 32) == 10
    assert (
        cost.decode_tokens_per_rank(
            batch_per_die=48, mtp=True, microbatches=2, dies=320, ep=320, model=MODEL
        )
        == 48
    )
    assert cost.prefill_tokens_per_rank(tokens_per_die=512, microbatches=2, dies=32, ep=32) == 256
