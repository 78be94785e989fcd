"""The cost of a decode step and of a prefill batch on one instance, from first principles.

Every kernel is a roofline on one die (emulator/model/serving/kernels.py): FLOPs at the die's peak
times the kernel's measured efficiency (MLA attention 65.4% of BF16, INT8 GEMMs 80%), bytes moved
(weights, KV read and written, activations) at the die's HBM bandwidth times the MLA kernel's
measured efficiency (1,346 of 1,600 GB/s), plus one launch per kernel. The instance runs at the
pace of its busiest die: its expert load is stretched by the placement's imbalance. The MoE
dispatch and combine are an INPUT (the caller times them on the fabric or the RDMA plane:
`dispatch_s` and `combine_s` are ONE collective of the step's shape), because communication
belongs to the fabric, not to this model.

Two microbatches split a step's tokens in two halves: each half re-reads the weights (a
memory-bound kernel does not get faster with fewer tokens) and launches its own kernels, the
collectives run twice at half size, and the two-stream schedule (kernels.schedule) hides what the
other microbatch's compute covers, no more. The only fitted figures are the kernel launch cost
and the prefill kernels' efficiency (HardwareProfile.serving, src "fit"; calibrate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cmemu.emulator.model.costmodel import NS, ub_transfer_ns
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving import kernels as k
from cmemu.emulator.model.serving.models import ModelShape
from cmemu.emulator.model.topology import DeviceKind


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """A step's duration and where it went (emulated seconds):
    total = compute + comm - hidden + fixed."""

    total_s: float
    compute_s: float  # kernels' roofline time, every layer and microbatch
    comm_s: float  # MoE dispatch + combine, every layer and microbatch, before overlap
    hidden_s: float  # what the two-stream schedule overlapped (0 with one microbatch)
    fixed_s: float  # kernel launches, the graph launch, exposed EMS loads


def kv_bytes_per_token(model: ModelShape, profile: HardwareProfile = DEFAULT_PROFILE) -> float:
    """The KV cache of one token over every layer (MLA: 576 elements per layer)."""
    return model.layers * model.kv_elements_per_token_layer * profile.serving.kv_bytes_per_element


def slots_per_die(model: ModelShape, ep: int, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    """Expert slots on each EP die in the published layouts (1 at EP320, 10 at EP32)."""
    return k.slots_per_die(model, ep, profile)


def _stages(
    model: ModelShape,
    work: k.LayerWork,
    r: k.Rates,
    *,
    dispatch_s: float,
    combine_s: float,
    profile: HardwareProfile,
) -> tuple[k.Stage, k.Stage]:
    """(a dense layer, a MoE layer) of one microbatch."""
    s = profile.serving
    attention = k.attention_op(model, work, r, s.kernels_attention)
    dense = k.Stage(
        a=k.Op(
            attention.kernels_s + k.dense_ffn_op(model, work, r, 0).kernels_s,
            (s.kernels_attention + s.kernels_ffn) * r.launch_s,
        )
    )
    moe = k.Stage(
        a=attention,
        d_s=dispatch_s,
        e=k.experts_op(model, work, r, s.kernels_ffn),
        c_s=combine_s,
    )
    return dense, moe


def _step(sched: k.Schedule, *, extra_fixed_s: float, microbatches: int) -> StepTime:
    total = sched.total_s + extra_fixed_s
    fixed = sched.launch_s + extra_fixed_s
    hidden = sched.kernels_s + sched.comm_s + fixed - total if microbatches > 1 else 0.0
    return StepTime(
        total_s=total,
        compute_s=sched.kernels_s,
        comm_s=sched.comm_s,
        hidden_s=max(0.0, hidden),
        fixed_s=fixed if hidden >= 0 else fixed + hidden,
    )


def decode_tokens_per_rank(
    *, batch_per_die: int, mtp: bool, microbatches: int, dies: int, ep: int, model: ModelShape
) -> int:
    """Tokens each EP rank dispatches per collective in a decode step."""
    per_request = 1 + (model.mtp_layers if mtp else 0)
    return max(1, math.ceil(batch_per_die * per_request * dies / ep / microbatches))


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
) -> k.LayerWork:
    requests = batch_per_die / microbatches
    tokens = requests * tokens_per_request
    # absorbed MLA: every query token scores the compressed KV (576) and reads it back (512)
    flops = (
        2 * tokens * kv_tokens * model.heads * (model.kv_elements_per_token_layer + model.kv_lora)
    )
    kv_bytes = requests * kv_tokens * model.kv_elements_per_token_layer
    kv_bytes *= profile.serving.kv_bytes_per_element
    copies = tokens * (model.top_k + model.shared_experts) * imbalance * ep_spread
    return k.LayerWork(
        attention_flops=flops,
        kv_read_bytes=kv_bytes,
        tokens=tokens,
        expert_tokens=copies,
        expert_slots=slots_per_die(model, ep, profile),
    )


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
    """One MoE decode layer, launches included, in the steady state of the model's run of MoE
    layers: (time, kernels' roofline time)."""
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
    r = k.rates(profile, compute_efficiency=profile.serving.decode_compute_efficiency)
    _, moe = _stages(model, work, r, dispatch_s=dispatch_s, combine_s=combine_s, profile=profile)
    n = model.moe_layers
    stage = k.Stage(moe.a, moe.d_s, moe.e, moe.c_s, repeat=n)
    sched = k.schedule([stage], microbatches, launch_held=profile.serving.launch_core_share)
    return sched.total_s / n, sched.kernels_s / n


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
    the model (the accepted token and the draft), then the MTP module drafts the next (one MoE
    layer and the head again, one token per request). `compute_share`: the slowest die's
    (kernels.rates)."""
    s = profile.serving
    eff = s.decode_compute_efficiency
    r = k.rates(profile, compute_share=compute_share, compute_efficiency=eff)
    per_request = 1 + (model.mtp_layers if mtp else 0)

    def work(tokens_per_request: int) -> k.LayerWork:
        return _decode_work(
            model,
            batch_per_die=batch_per_die,
            kv_tokens=kv_tokens,
            tokens_per_request=tokens_per_request,
            microbatches=microbatches,
            imbalance=imbalance,
            ep_spread=dies / ep,
            ep=ep,
            profile=profile,
        )

    def layer_stages(w: k.LayerWork) -> tuple[k.Stage, k.Stage]:
        return _stages(model, w, r, dispatch_s=dispatch_s, combine_s=combine_s, profile=profile)

    dense, moe = layer_stages(work(per_request))
    tokens = batch_per_die * per_request / microbatches
    stages = [
        k.Stage(dense.a, repeat=model.dense_layers),
        k.Stage(moe.a, moe.d_s, moe.e, moe.c_s, repeat=model.moe_layers),
        k.Stage(k.head_op(model, tokens, r, s.kernels_head)),
    ]
    if mtp:
        _, draft = layer_stages(work(1))
        draft_tokens = batch_per_die / microbatches
        stages += [
            k.Stage(draft.a, draft.d_s, draft.e, draft.c_s, repeat=model.mtp_layers),
            k.Stage(k.head_op(model, draft_tokens, r, s.kernels_head)),
        ]
    return _step(
        k.schedule(stages, microbatches, launch_held=s.launch_core_share),
        extra_fixed_s=s.graph_launch_s,
        microbatches=microbatches,
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
    compute are exposed. Prefill kernels run at `serving.prefill_compute_efficiency` of the
    decode-measured compute rates. `compute_share`: the slowest die's (kernels.rates)."""
    s = profile.serving
    r = k.rates(
        profile, compute_share=compute_share, compute_efficiency=s.prefill_compute_efficiency
    )
    qk, v = model.head_dim + model.rope_dim, model.head_dim
    tokens = tokens_per_die / microbatches
    # each request's context (the keys a query sees on average, twice: causal) is read once
    context = 2 * attention_pairs_per_die / max(tokens_per_die, 1e-9)
    kv_read = requests_per_die / microbatches * context * model.kv_elements_per_token_layer
    work = k.LayerWork(
        attention_flops=2 * attention_pairs_per_die / microbatches * model.heads * (qk + v),
        kv_read_bytes=kv_read * s.kv_bytes_per_element,
        tokens=tokens,
        expert_tokens=tokens * (model.top_k + model.shared_experts) * imbalance * dies / ep,
        expert_slots=slots_per_die(model, ep, profile),
    )
    dense, moe = _stages(
        model, work, r, dispatch_s=dispatch_s, combine_s=combine_s, profile=profile
    )
    stages = [
        k.Stage(dense.a, repeat=model.dense_layers),
        k.Stage(moe.a, moe.d_s, moe.e, moe.c_s, repeat=model.moe_layers),
        k.Stage(k.head_op(model, requests_per_die / microbatches, r, s.kernels_head)),
    ]
    sched = k.schedule(stages, microbatches, launch_held=s.launch_core_share)
    step = _step(sched, extra_fixed_s=s.graph_launch_s, microbatches=microbatches)
    if load_s <= 0:
        return step
    exposed = _pipelined(sched.total_s, load_s, model.layers) - sched.total_s
    return StepTime(
        total_s=step.total_s + exposed,
        compute_s=step.compute_s,
        comm_s=step.comm_s,
        hidden_s=step.hidden_s,
        fixed_s=step.fixed_s + exposed,
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
