"""The training model: layout checks, the step from the serving roofline and the collectives,
checkpoints and what a failure loses, the job's state machine, and the 40-day run."""

from __future__ import annotations

import dataclasses

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.topology import build
from cmemu.emulator.model.training import checkpoint
from cmemu.emulator.model.training.job import FINISHED, RECOVERING, RUNNING, JobProgress
from cmemu.emulator.model.training.longrun import RunParams, run, simulate_training
from cmemu.emulator.model.training.spec import shape_of
from cmemu.emulator.model.training.step import (
    gradient_buckets,
    groups,
    params_per_die,
    step_time,
    total_params,
)
from cmemu.emulator.model.training.timing import ModelTimer, first_dies


def test_a_layout_must_cover_the_dies() -> None:
    s = shape_of(name="t", npus=4)
    assert (s.data_parallel, s.expert_parallel, s.dies, s.micro_batches) == (8, 1, 8, 1)
    assert s.checkpoint_every == DEFAULT_PROFILE.training.checkpoint_every
    assert shape_of(name="t", npus=4, expert_parallel=4).data_parallel == 2
    for bad in (
        {"name": "T!", "npus": 1},
        {"name": "t", "npus": 0},
        {"name": "t", "npus": 2, "data_parallel": 3},
        {"name": "t", "npus": 2, "expert_parallel": 3},
    ):
        with pytest.raises(InvalidArgumentError):
            shape_of(**bad)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        shape_of(name="t", npus=1, model="gpt-9")


def test_deepseek_has_its_published_671b_parameters() -> None:
    assert total_params(get_model("deepseek-v3")) == pytest.approx(671e9, rel=0.02)
    model = get_model("deepseek-v3")
    assert params_per_die(model, 1) == total_params(model)
    assert params_per_die(model, 256) < total_params(model) / 20


def test_the_step_adds_backward_micro_batches_and_the_all_reduce() -> None:
    one = shape_of(name="t", npus=1, data_parallel=1, expert_parallel=2)
    two = shape_of(name="t", npus=1, data_parallel=1, expert_parallel=2, micro_batches=2)
    a = step_time(one, dispatch_s=1e-3, combine_s=1e-3, allreduce_bucket_s=0.0)
    b = step_time(two, dispatch_s=1e-3, combine_s=1e-3, allreduce_bucket_s=0.0)
    assert b.compute_s == pytest.approx(2 * a.compute_s)
    assert a.compute_s > (1 + DEFAULT_PROFILE.training.backward_factor) * 0.9 * a.forward_s
    assert a.allreduce_s == 0.0  # one data-parallel rank: nothing to reduce
    dp = shape_of(name="t", npus=2)
    buckets = gradient_buckets(dp)
    assert buckets.count > 1 and buckets.bytes <= DEFAULT_PROFILE.training.gradient_bucket_bytes
    c = step_time(dp, dispatch_s=0, combine_s=0, allreduce_bucket_s=0.01)
    assert c.allreduce_s == pytest.approx(0.01 * buckets.count)
    slower = step_time(dp, dispatch_s=0, combine_s=0, allreduce_bucket_s=0.02)
    assert slower.total_s > c.total_s


def test_model_mode_times_the_collectives_once_on_the_link_graph() -> None:
    topo = build("cm-mini")
    timer = ModelTimer(topo)
    shape = shape_of(name="t", npus=4, expert_parallel=2)
    dies = first_dies(topo, 4, DEFAULT_PROFILE)
    assert dies[:3] == ["n00-npu0.d0", "n00-npu0.d1", "n00-npu1.d0"]
    g = groups(dies, shape)
    assert g.expert_parallel == ("n00-npu0.d0", "n00-npu0.d1") and len(g.data_parallel) == 4
    first = timer.step(shape, dies)
    assert first.allreduce_s > 0 and first.total_s > first.compute_s
    assert len(timer._memo) == 3  # dispatch, combine, one bucket's all-reduce
    assert timer.step(shape, dies) == first and len(timer._memo) == 3


def test_checkpoints_are_due_every_n_steps_and_shard_per_npu() -> None:
    assert [s for s in range(0, 7) if checkpoint.due(s, 3)] == [3, 6]
    assert not checkpoint.due(5, 0)
    assert checkpoint.steps_lost(7, 5) == 2 and checkpoint.steps_lost(5, 5) == 0
    shape = shape_of(name="t", npus=4)
    shards = checkpoint.shards("t", 12, shape)
    assert {s.npu_index for s in shards} == {0, 1, 2, 3}
    assert all(s.size <= DEFAULT_PROFILE.training.checkpoint_object_max_bytes for s in shards)
    assert sum(s.size for s in shards) >= checkpoint.checkpoint_bytes(shape)
    assert all(s.key.startswith(checkpoint.prefix("t")) for s in shards)
    # a small job checkpoints what its HBM holds, a whole supernode the model's full state
    assert checkpoint.checkpoint_bytes(shape) == 8 * DEFAULT_PROFILE.npu.hbm_bytes_per_die
    big = shape_of(name="t", npus=384)
    full = total_params(big.model) * DEFAULT_PROFILE.training.checkpoint_bytes_per_param
    assert checkpoint.checkpoint_bytes(big) == pytest.approx(full, rel=1e-9)


def test_a_failure_rewinds_to_the_last_checkpoint() -> None:
    job = JobProgress(name="t", steps=10, checkpoint_every=3, started_ns=0)
    job.running(step_s=2.0)
    due = [job.step_done() for _ in range(5)]
    assert due == [False, False, True, False, False]
    job.checkpointed(3)
    assert job.failed(now_ns=20 * 10**9) == 2
    assert (job.state, job.step, job.steps_lost) == (RECOVERING, 3, 2)
    assert job.useful_s == pytest.approx(6.0)
    job.restored(now_ns=30 * 10**9, step_s=2.0)
    assert (job.state, job.restarts) == (RUNNING, 1)
    assert job.goodput(30 * 10**9) == pytest.approx(6.0 / 30)
    while not job.done:
        job.step_done()
    job.end(FINISHED, 44 * 10**9)
    assert job.goodput(99 * 10**9) == pytest.approx(20.0 / 44)
    with pytest.raises(PreconditionError):
        job.failed(now_ns=50 * 10**9)


def test_a_corrupt_checkpoint_falls_back_one_more_and_counts_it() -> None:
    job = JobProgress(name="t", steps=0, checkpoint_every=3, started_ns=0)
    job.running(step_s=2.0)
    for _ in range(7):
        if job.step_done():
            job.checkpointed(job.step)
    assert (job.step, job.last_checkpoint_step) == (7, 6)
    assert job.failed(now_ns=20 * 10**9) == 1
    assert job.fell_back(3, 7) == 3  # the checkpoint of step 6 did not verify
    assert (job.step, job.last_checkpoint_step, job.steps_lost) == (3, 3, 4)
    assert job.useful_s == pytest.approx(6.0)
    assert job.fell_back(0, 8) == 3 and (job.step, job.steps_lost) == (0, 7)  # none left
    assert job.fell_back(0, 9) == 0 and job.useful_s == 0.0
    assert job.last_corrupt_checkpoint_ns == 9  # the last detection


def test_a_manifest_lists_its_checkpoint_s_shards_and_no_other() -> None:
    key = checkpoint.manifest_key("pretrain", 40)
    assert key == "checkpoint/pretrain/000000000040/manifest"
    assert key.startswith(checkpoint.prefix("pretrain"))
    data = checkpoint.manifest("pretrain", 40, ["a", "b"])
    assert checkpoint.manifest_keys(data, "pretrain", 40) == ["a", "b"]
    for wrong in (("pretrain", 39), ("other", 40)):
        with pytest.raises(ValueError, match="the manifest is of 'pretrain' step 40"):
            checkpoint.manifest_keys(data, *wrong)
    for junk in (b"[]", b'{"job": "pretrain"}', b"\xff"):
        with pytest.raises(ValueError):
            checkpoint.manifest_keys(junk, "pretrain", 40)


PARAMS = RunParams(
    horizon_s=40 * 86_400.0,
    npus=384,
    mtbf_s=10_000 * 3600.0,
    step_s=20.0,
    checkpoint_every=50,
    checkpoint_write_s=5.0,
    reload_s=30.0,
    heartbeat_interval_s=5.0,
    misses_to_fail=3,
    replace_s=120.0,
    restart_s=60.0,
    spares=12,
    repair_s=86_400.0,
    recovery_target_s=600.0,
)


def test_the_long_run_accounts_failures_and_recoveries() -> None:
    r = run(PARAMS, seed=1)
    expected = PARAMS.horizon_s * PARAMS.npus / PARAMS.mtbf_s  # ~37 failures
    assert 0.5 * expected < r.failures < 1.5 * expected
    assert len(r.recovery_s) == r.failures and r.steps_lost > 0
    floor = PARAMS.replace_s + PARAMS.restart_s + PARAMS.reload_s
    assert all(floor + 10.0 <= x <= floor + 15.0 for x in r.recovery_s)  # 2-3 missed intervals
    assert r.recovered_within_target == 1.0 and 0.9 < r.goodput < 1.0
    assert run(PARAMS, seed=1) == r  # seeded: the same run
    never = run(dataclasses.replace(PARAMS, mtbf_s=1e15), seed=1)
    assert never.failures == 0 and never.steps_lost == 0
    ideal = 50 * 20.0 / (50 * 20.0 + 5.0)  # only the checkpoint writes are waste
    assert never.goodput == pytest.approx(ideal, rel=1e-3)
    assert r.goodput < never.goodput


def test_without_spares_recoveries_wait_for_repairs() -> None:
    starved = run(dataclasses.replace(PARAMS, spares=1), seed=3)
    assert starved.waited_for_spare > 0
    assert starved.recovered_within_target < 1.0
    assert max(starved.recovery_s) > PARAMS.recovery_target_s


def test_simulate_training_on_the_cost_model() -> None:
    r = simulate_training(days=40, mtbf_hours=5_000, npus=16, preset="cm-mini", seed=2)
    s = r.summary()
    assert s["days"] == 40 and s["npus"] == 16 and s["failures"] == r.failures
    assert 0 < s["goodput"] <= 1 and s["step_s"] > 0 and s["reload_s"] > 0
    with pytest.raises(InvalidArgumentError):
        simulate_training(days=0, mtbf_hours=1, npus=1, preset="cm-mini")
    with pytest.raises(InvalidArgumentError):
        simulate_training(days=1, mtbf_hours=-1, npus=1, preset="cm-mini")
    with pytest.raises(InvalidArgumentError):
        simulate_training(days=1, mtbf_hours=1, npus=17, preset="cm-mini")
