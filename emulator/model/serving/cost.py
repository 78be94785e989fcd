"""The cost of a decode step and of a prefill batch on one instance.

Every kernel is a roofline on one die at the measured rates (HARDWARE.md): MLA attention at 65.4%
of the BF16 peak, every kernel's bytes at the die's HBM bandwidth times the MLA kernel's measured
efficiency (1,346 of 1,600 GB/s), the INT8 GEMMs (projections, experts, head) at the INT8
utilisation, weights and KV read from HBM. The instance runs at the pace of its busiest die: the
expert compute is stretched by the placement's imbalance. The MoE dispatch and combine are an
INPUT (the caller times them on the fabric: `dispatch_s` and `combine_s` are ONE collective of the
step's shape), because communication belongs to the fabric, not to this model.

Two microbatches split a step's tokens in two halves whose compute and communication overlap:
each half re-reads the weights (a memory-bound kernel does not get faster with fewer tokens), the
collectives run twice at half size, and a fitted share of the smaller of compute and
communication is hidden. Fitted parameters live in HardwareProfile.serving (src "fit").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emulator.model.costmodel import NS, ub_transfer_ns
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.serving.models import ModelShape
from emulator.model.topology import DeviceKind


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """A step's duration and where it went (emulated seconds)."""

    total_s: float
    compute_s: float  # kernels, all layers
    comm_s: float  # MoE dispatch + combine, all layers, before overlap
    hidden_s: float  # communication hidden behind the other microbatch's compute
    fixed_s: float  # graph launch, per-layer and per-step overheads, EMS loads


@dataclass(frozen=True)
class _Rates:
    bf16: float
    int8: float
    hbm: float
    weight_bytes: float


def _rates(profile: HardwareProfile, compute_share: float = 1.0) -> _Rates:
    """The kernels' rates on a die; `compute_share` < 1: the instance's slowest die (a `slow`
    NPU), whose pace every layer waits for at its dispatch and combine."""
    s = profile.serving
    peaks = profile.npu.peak_ops_per_s_per_die
    return _Rates(
        bf16=peaks["BF16"] * s.mla_compute_utilisation * compute_share,
        int8=peaks["INT8"] * s.int8_gemm_utilisation * compute_share,
        hbm=profile.npu.hbm_bytes_per_s_per_die * s.hbm_efficiency * compute_share,
        weight_bytes=s.weight_bytes_per_param,
    )


def _kernel(flops: float, nbytes: float, rate: float, bandwidth: float) -> float:
    return max(flops / rate, nbytes / bandwidth)


def kv_bytes_per_token(model: ModelShape, profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """The KV cache of one token over every layer (MLA: 576 elements per layer)."""
    return model.layers * model.kv_elements_per_token_layer * profile.serving.kv_bytes_per_element


def slots_per_die(model: ModelShape, ep: int, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    """Expert slots on each EP die in the published layouts (1 at EP320, 10 at EP32)."""
    s = profile.serving
    share = 1.0 - s.shared_slot_fraction - s.redundant_slot_fraction
    return max(1, math.ceil(model.routed_experts / share / ep - 1e-9))


def _layer(compute_s: float, comm_s: float, microbatches: int, profile: HardwareProfile) -> float:
    hidden = profile.serving.microbatch_overlap * min(compute_s, comm_s) if microbatches > 1 else 0
    return compute_s + comm_s - hidden


@dataclass(frozen=True, kw_only=True)
class _LayerWork:
    """One layer's kernels for one microbatch on the busiest die."""

    attention_flops: float
    attention_bytes: float
    tokens: float  # tokens through the projections
    expert_tokens: float  # token copies through this die's experts
    expert_slots: int


def _layer_compute(
    model: ModelShape, work: _LayerWork, rates: _Rates, *, moe: bool, efficiency: float
) -> float:
    attention = _kernel(work.attention_flops, work.attention_bytes, rates.bf16, rates.hbm)
    params = model.attention_params
    weights = params * rates.weight_bytes
    projections = _kernel(2 * work.tokens * params, weights, rates.int8, rates.hbm)
    if moe:
        ffn = _kernel(
            2 * work.expert_tokens * model.expert_params,
            work.expert_slots * model.expert_params * rates.weight_bytes,
            rates.int8,
            rates.hbm,
        )
    else:
        ffn = _kernel(
            2 * work.tokens * model.dense_ffn_params,
            model.dense_ffn_params * rates.weight_bytes,
            rates.int8,
            rates.hbm,
        )
    return (attention + projections + ffn) / efficiency


def _head_s(model: ModelShape, tokens: float, rates: _Rates) -> float:
    params = model.head_params
    return _kernel(2 * tokens * params, params * rates.weight_bytes, rates.int8, rates.hbm)


def _layers(
    model: ModelShape,
    work: _LayerWork,
    *,
    microbatches: int,
    comm_per_layer_s: float,
    efficiency: float,
    profile: HardwareProfile,
    compute_share: float = 1.0,
) -> tuple[float, float, float, float]:
    """(time, compute, comm, hidden) of all layers of one forward pass."""
    rates = _rates(profile, compute_share)
    overhead = profile.serving.layer_overhead_s
    dense_c = microbatches * _layer_compute(model, work, rates, moe=False, efficiency=efficiency)
    moe_c = microbatches * _layer_compute(model, work, rates, moe=True, efficiency=efficiency)
    moe_t = _layer(moe_c, comm_per_layer_s, microbatches, profile)
    hidden = moe_c + comm_per_layer_s - moe_t
    n_moe = model.moe_layers
    time = model.dense_layers * (dense_c + overhead) + n_moe * (moe_t + overhead)
    return (
        time,
        model.dense_layers * dense_c + n_moe * moe_c,
        n_moe * comm_per_layer_s,
        n_moe * hidden,
    )


def decode_tokens_per_rank(
    *, batch_per_die: int, mtp: bool, microbatches: int, dies: int, ep: int, model: ModelShape
) -> int:
    """Tokens each EP rank dispatches per collective in a decode step."""
    per_request = 1 + (model.mtp_layers if mtp else 0)
    return max(1, math.ceil(batch_per_die * per_request * dies / ep / microbatches))


def decode_layer_s(
    model: ModelShape,
    *,
    batch_per_die: int,
    kv_tokens: float,
    tokens_per_request: int,
    microbatches: int,
    imbalance: float,
    ep_spread: float,
    ep: int,
    dispatch_s: float,
    combine_s: float,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> tuple[float, float]:
    """One MoE decode layer (overhead included): (time, compute)."""
    work = _decode_work(
        model,
        batch_per_die=batch_per_die,
        kv_tokens=kv_tokens,
        tokens_per_request=tokens_per_request,
        microbatches=microbatches,
        imbalance=imbalance,
        ep_spread=ep_spread,
        ep=ep,
        profile=profile,
    )
    c = microbatches * _layer_compute(model, work, _rates(profile), moe=True, efficiency=1.0)
    comm = microbatches * (dispatch_s + combine_s)
    return _layer(c, comm, microbatches, profile) + profile.serving.layer_overhead_s, c


def _decode_work(
    model: ModelShape,
    *,
    batch_per_die: int,
    kv_tokens: float,
    tokens_per_request: int,
    microbatches: int,
    imbalance: float,
    ep_spread: float,
    ep: int,
    profile: HardwareProfile,
) -> _LayerWork:
    requests = batch_per_die / microbatches
    tokens = requests * tokens_per_request
    heads = model.heads
    # absorbed MLA: every query token scores the compressed KV (576) and reads it back (512)
    flops = 2 * tokens * kv_tokens * heads * (model.kv_elements_per_token_layer + model.kv_lora)
    kv_bytes = requests * kv_tokens * model.kv_elements_per_token_layer
    kv_bytes *= profile.serving.kv_bytes_per_element
    copies = tokens * (model.top_k + model.shared_experts) * imbalance * ep_spread
    return _LayerWork(
        attention_flops=flops,
        attention_bytes=kv_bytes,
        tokens=tokens,
        expert_tokens=copies,
        expert_slots=slots_per_die(model, ep, profile),
    )


def decode_step(
    model: ModelShape,
    *,
    batch_per_die: int,
    kv_tokens: float,
    mtp: bool,
    microbatches: int,
    imbalance: float,
    dies: int,
    ep: int,
    dispatch_s: float,
    combine_s: float,
    profile: HardwareProfile = DEFAULT_PROFILE,
    compute_share: float = 1.0,
) -> StepTime:
    """One decode step of an instance whose busiest die holds `batch_per_die` requests with
    `kv_tokens` of context on average. With MTP every request runs 1 + mtp_layers tokens through
    the model (the accepted token and the draft), then the MTP module drafts the next.
    `compute_share`: the slowest die's (module `_rates`)."""
    s = profile.serving
    rates = _rates(profile, compute_share)
    per_request = 1 + (model.mtp_layers if mtp else 0)
    spread = dies / ep

    def work(tokens_per_request: int) -> _LayerWork:
        return _decode_work(
            model,
            batch_per_die=batch_per_die,
            kv_tokens=kv_tokens,
            tokens_per_request=tokens_per_request,
            microbatches=microbatches,
            imbalance=imbalance,
            ep_spread=spread,
            ep=ep,
            profile=profile,
        )

    comm = microbatches * (dispatch_s + combine_s)
    time, compute, comm_total, hidden = _layers(
        model,
        work(per_request),
        microbatches=microbatches,
        comm_per_layer_s=comm,
        efficiency=1.0,
        profile=profile,
        compute_share=compute_share,
    )
    head = _head_s(model, batch_per_die * per_request, rates)
    if mtp:
        draft = work(1)
        c = microbatches * _layer_compute(model, draft, rates, moe=True, efficiency=1.0)
        layer = _layer(c, comm, microbatches, profile)
        extra = model.mtp_layers * (layer + s.layer_overhead_s)
        time += extra + _head_s(model, batch_per_die, rates)
        compute += model.mtp_layers * c
        comm_total += model.mtp_layers * comm
        hidden += model.mtp_layers * (c + comm - layer)
        head += _head_s(model, batch_per_die, rates)
    fixed = s.graph_launch_s + s.step_overhead_s
    total = time + head + fixed
    fixed_all = total - (compute + head) - (comm_total - hidden)
    return StepTime(
        total_s=total,
        compute_s=compute + head,
        comm_s=comm_total,
        hidden_s=hidden,
        fixed_s=fixed_all,
    )


def prefill_tokens_per_rank(*, tokens_per_die: int, microbatches: int, dies: int, ep: int) -> int:
    return max(1, math.ceil(tokens_per_die * dies / ep / microbatches))


def prefill_batch(
    model: ModelShape,
    *,
    tokens_per_die: float,
    attention_pairs_per_die: float,
    requests_per_die: float,
    load_s: float,
    microbatches: int,
    imbalance: float,
    dies: int,
    ep: int,
    dispatch_s: float,
    combine_s: float,
    profile: HardwareProfile = DEFAULT_PROFILE,
    compute_share: float = 1.0,
) -> StepTime:
    """One prefill batch. Tokens spread evenly over the instance's dies; `attention_pairs_per_die`
    counts (query, key) pairs of causal attention (a new token attends to the whole cached
    prefix and to the new tokens before it, so a longer cached context costs more). `load_s` is
    the batch's loading of matched prefix blocks from EMS into HBM (`prefix_load_s`): it is
    pipelined layer by layer with the forward pass (layer l's blocks arrive while the layers
    before it compute), so only the first layer's share and whatever the loads take beyond the
    compute are exposed. `compute_share`: the
    slowest die's (module `_rates`)."""
    s = profile.serving
    rates = _rates(profile, compute_share)
    qk, v = model.head_dim + model.rope_dim, model.head_dim
    tokens = tokens_per_die / microbatches
    work = _LayerWork(
        attention_flops=2 * attention_pairs_per_die / microbatches * model.heads * (qk + v),
        attention_bytes=tokens * model.kv_elements_per_token_layer * s.kv_bytes_per_element,
        tokens=tokens,
        expert_tokens=tokens * (model.top_k + model.shared_experts) * imbalance * dies / ep,
        expert_slots=slots_per_die(model, ep, profile),
    )
    comm = microbatches * (dispatch_s + combine_s)
    time, compute, comm_total, hidden = _layers(
        model,
        work,
        microbatches=microbatches,
        comm_per_layer_s=comm,
        efficiency=s.prefill_efficiency,
        profile=profile,
        compute_share=compute_share,
    )
    head = _head_s(model, requests_per_die, rates)
    layers = time if load_s <= 0 else _pipelined(time, load_s, model.layers)
    total = layers + head + s.graph_launch_s
    return StepTime(
        total_s=total,
        compute_s=compute + head,
        comm_s=comm_total,
        hidden_s=hidden,
        fixed_s=total - (compute + head) - (comm_total - hidden),
    )


def _pipelined(compute_s: float, load_s: float, layers: int) -> float:
    """A forward pass of `layers` equal layers whose inputs (a layer's share of the loaded KV)
    stream in while the layers before compute: the first layer waits for its share, then each
    layer takes the longer of its compute and the next share's load."""
    c, a = compute_s / layers, load_s / layers
    return a + c + (layers - 1) * max(a, c)


def prefix_load_s(
    blocks: int,
    block_bytes: float,
    *,
    ub_across_servers: bool,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> float:
    """Reading `blocks` cached KV blocks of a prompt from EMS into a prefill die's HBM: one UB
    read per block from the memory pool (it is striped over the supernode's nodes, so a block
    crosses nodes), at the die's UB bandwidth with the pool's latency per read. Without UB
    across servers (`cluster-roce`) the pool's blocks come over the die's RDMA port."""
    if blocks <= 0:
        return 0.0
    if ub_across_servers:
        one = (
            ub_transfer_ns(
                round(block_bytes),
                src=DeviceKind.NPU,
                dst=DeviceKind.MEMPOOL,
                cross_node=True,
                profile=profile,
            )
            / NS
        )
    else:
        rdma = profile.npu.rdma_bytes_per_s_per_die * profile.scaleout.efficiency
        one = profile.scaleout.latency_s(switches=3) + block_bytes / rdma
    return blocks * one


def shared_block_credit(
    model: ModelShape,
    *,
    block_bytes: float,
    block_tokens: int,
    batch_tokens: int,
    dies: int,
    ep: int,
    ub_across_servers: bool,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> float:
    """What a prompt block held in EMS (not in a prefill instance's HBM) saves, as a share of
    prefilling it: 1 - (loading it, `prefix_load_s`) / (prefilling it: a full batch's forward
    pass per block, communication left out, so the share is if anything low). The kv-aware
    router's credit for the EMS tier (router.py)."""
    per_die = batch_tokens / dies
    batch = prefill_batch(
        model,
        tokens_per_die=per_die,
        attention_pairs_per_die=per_die * (block_tokens + 1) / 2,
        requests_per_die=batch_tokens / block_tokens / dies,
        load_s=0.0,
        microbatches=1,
        imbalance=1.0,
        dies=dies,
        ep=ep,
        dispatch_s=0.0,
        combine_s=0.0,
        profile=profile,
    )
    per_block = batch.total_s * block_tokens / batch_tokens
    load = prefix_load_s(1, block_bytes, ub_across_servers=ub_across_servers, profile=profile)
    return max(0.0, 1.0 - load / per_block)
