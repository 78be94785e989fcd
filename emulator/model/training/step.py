"""The time of one training step, from the serving cost model's roofline and the collectives.

A step is `micro_batches` forward+backward passes of `tokens_per_die` tokens on every die, then
the gradient all-reduce over the data-parallel ranks. The forward pass is the serving cost
model's prefill batch (emulator/model/serving/cost.py: the same kernels at the same measured
rates, one sequence per die, the MoE dispatch and combine over the expert-parallel group as
INPUTS timed on the fabric); the backward pass costs `backward_factor` times its compute and runs
the all-to-alls again. The all-reduce goes in buckets of `gradient_bucket_bytes` (as data-parallel
frameworks bucket gradients), each one collective of the fabric; the caller times one bucket.

Simplifications (documented, not hidden): every gradient is all-reduced over the first
data-parallel group (expert gradients really reduce over fewer ranks, the dense ones over more);
no overlap of the all-reduce with the backward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.cost import prefill_batch
from cmemu.emulator.model.serving.models import ModelShape
from cmemu.emulator.model.training.spec import TrainingShape


def total_params(model: ModelShape) -> int:
    """Every weight of the model once: attention, dense FFNs, routed and shared experts, the
    embedding and the head."""
    experts = model.moe_layers * (model.routed_experts + model.shared_experts)
    return (
        model.layers * model.attention_params
        + model.dense_layers * model.dense_ffn_params
        + experts * model.expert_params
        + 2 * model.head_params
    )


def params_per_die(model: ModelShape, ep: int) -> int:
    """The weights one die holds: all but the routed experts, and its share of those."""
    routed = model.moe_layers * model.routed_experts * model.expert_params
    return total_params(model) - routed + math.ceil(routed / ep)


@dataclass(frozen=True, kw_only=True)
class Groups:
    """The ranks (die ids) of the collectives a step runs."""

    data_parallel: tuple[str, ...]  # the first data-parallel group: one die per EP group
    expert_parallel: tuple[str, ...]  # the first expert-parallel group


def groups(dies: list[str], shape: TrainingShape) -> Groups:
    ep = shape.expert_parallel
    return Groups(
        data_parallel=tuple(dies[::ep][: shape.data_parallel]),
        expert_parallel=tuple(dies[:ep]),
    )


@dataclass(frozen=True, kw_only=True)
class Buckets:
    count: int
    bytes: int  # each


def gradient_buckets(shape: TrainingShape, profile: HardwareProfile = DEFAULT_PROFILE) -> Buckets:
    """One die's gradients in equal buckets of at most gradient_bucket_bytes (none with DP 1)."""
    if shape.data_parallel < 2:
        return Buckets(count=0, bytes=0)
    t = profile.training
    total = math.ceil(
        params_per_die(shape.model, shape.expert_parallel) * t.gradient_bytes_per_param
    )
    count = math.ceil(total / t.gradient_bucket_bytes)
    return Buckets(count=count, bytes=math.ceil(total / count))


def moe_tokens_per_rank(profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    return profile.training.tokens_per_die


@dataclass(frozen=True, kw_only=True)
class TrainingStepTime:
    """A step's emulated seconds and where they went."""

    total_s: float
    compute_s: float  # forward + backward of every micro-batch, with their all-to-alls
    allreduce_s: float  # every gradient bucket
    forward_s: float  # one micro-batch's forward pass


def step_time(
    shape: TrainingShape,
    *,
    dispatch_s: float,
    combine_s: float,
    allreduce_bucket_s: float,
    profile: HardwareProfile = DEFAULT_PROFILE,
    compute_share: float = 1.0,
) -> TrainingStepTime:
    """`dispatch_s`/`combine_s`: one MoE collective over the EP group (0 with EP 1);
    `allreduce_bucket_s`: one gradient bucket's all-reduce over the DP group; `compute_share`:
    the slowest die's (a `slow` NPU): a synchronous step computes at its pace."""
    t = profile.training
    tokens = t.tokens_per_die
    ep = shape.expert_parallel
    forward = prefill_batch(
        shape.model,
        tokens_per_die=tokens,
        attention_pairs_per_die=tokens * (tokens + 1) / 2,  # one causal sequence per die
        requests_per_die=1,
        load_s=0.0,
        microbatches=1,
        imbalance=1.0,
        dies=ep,
        ep=ep,
        dispatch_s=dispatch_s,
        combine_s=combine_s,
        profile=profile,
        compute_share=compute_share,
    )
    exposed_comm = forward.comm_s - forward.hidden_s
    one = forward.total_s + t.backward_factor * forward.compute_s + exposed_comm
    compute = shape.micro_batches * one
    allreduce = gradient_buckets(shape, profile).count * allreduce_bucket_s
    return TrainingStepTime(
        total_s=compute + allreduce,
        compute_s=compute,
        allreduce_s=allreduce,
        forward_s=forward.total_s,
    )
