"""A forward pass from first principles: each kernel a roofline on one die, each layer's
microbatches scheduled on two streams (issue 23 item 1).

A kernel takes the longer of its two roofline terms: its FLOPs at the die's peak times the
kernel's efficiency, and the bytes it moves (weights read, KV read and written, activations read
and written) at the die's HBM bandwidth times the HBM efficiency. Every kernel also costs one
launch (`serving.kernel_launch_s`: the gap between two kernels of a captured graph while the
next task is issued and its inputs synchronised), so a layer's fixed cost is its kernel count
times that launch, per microbatch.

A MoE layer of one microbatch is a chain: the attention path's launches and kernels (A), the token
dispatch (D), the experts' launches and kernels (E), the combine (C), each waiting for the one
before it. Kernels hold the die's cores, collectives its UB ports (one collective at a time),
a launch holds the cores for its share `serving.launch_core_share` (setup, synchronisation) and
is otherwise its stream's own wait (the issue): while one microbatch's stream waits for an issue
or a collective, the other microbatch's kernels run (the two-stream schedules of DeepSeek and
CloudMatrix-Infer). So what overlaps is what the times allow: a collective longer than the other
microbatch's compute shows, a shorter one is hidden; each microbatch re-reads the weights and
launches its own kernels, which is what two microbatches cost. One microbatch runs everything
in series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.serving.models import ModelShape


@dataclass(frozen=True)
class Rates:
    """The rates kernels run at on one die: peaks times the measured kernel efficiencies."""

    bf16: float
    int8: float
    hbm: float
    weight_bytes: float
    act_bytes: float
    kv_bytes: float
    launch_s: float


def rates(
    profile: HardwareProfile, *, compute_share: float = 1.0, compute_efficiency: float = 1.0
) -> Rates:
    """`compute_share` < 1: the instance's slowest die (a `slow` NPU: its cores, its HBM and its
    task issue all at that share of their speed), whose pace every layer waits for at its
    dispatch and combine; `compute_efficiency`: the share of the measured stand-alone rates the
    step's kernels reach (`serving.decode_compute_efficiency`, `prefill_compute_efficiency`)."""
    s = profile.serving
    peaks = profile.npu.peak_ops_per_s_per_die
    return Rates(
        bf16=peaks["BF16"] * s.mla_compute_utilisation * compute_efficiency * compute_share,
        int8=peaks["INT8"] * s.int8_gemm_utilisation * compute_efficiency * compute_share,
        hbm=profile.npu.hbm_bytes_per_s_per_die * s.hbm_efficiency * compute_share,
        weight_bytes=s.weight_bytes_per_param,
        act_bytes=s.activation_bytes_per_element,
        kv_bytes=s.kv_bytes_per_element,
        launch_s=s.kernel_launch_s / compute_share,
    )


def roofline(flops: float, nbytes: float, rate: float, bandwidth: float) -> float:
    """One kernel: the longer of its compute and its memory traffic."""
    return max(flops / rate, nbytes / bandwidth)


@dataclass(frozen=True, kw_only=True)
class LayerWork:
    """One layer's work for ONE microbatch on the busiest die."""

    attention_flops: float
    kv_read_bytes: float  # the context's KV the attention reads
    tokens: float  # tokens through the projections (their KV is written)
    expert_tokens: float  # token copies through this die's experts
    expert_slots: int


@dataclass(frozen=True)
class Op:
    """A compute operation: its kernels' roofline time and their launches."""

    kernels_s: float
    launch_s: float

    @property
    def total_s(self) -> float:
        return self.kernels_s + self.launch_s


def attention_op(model: ModelShape, w: LayerWork, r: Rates, kernels: int) -> Op:
    """Norms, the MLA projections (INT8 GEMMs reading their weights), the attention core (BF16,
    reading the context's KV and writing the new tokens'), the router's gate."""
    h = model.hidden
    params = model.attention_params
    proj_bytes = params * r.weight_bytes + 2 * w.tokens * h * r.act_bytes
    proj = roofline(2 * w.tokens * params, proj_bytes, r.int8, r.hbm)
    kv_write = w.tokens * model.kv_elements_per_token_layer * r.kv_bytes
    core = roofline(w.attention_flops, w.kv_read_bytes + kv_write, r.bf16, r.hbm)
    gate_params = h * model.routed_experts
    gate = roofline(
        2 * w.tokens * gate_params, gate_params * r.act_bytes + w.tokens * h * r.act_bytes,
        r.bf16, r.hbm,
    )  # fmt: skip
    return Op(proj + core + gate, kernels * r.launch_s)


def active_slots(slots: int, copies: float) -> float:
    """Expert slots that receive a token when `copies` land on `slots` evenly at random: a slot
    that gets none reads no weights."""
    if copies <= 0:
        return 0.0
    return slots * (1.0 - float((1.0 - 1.0 / slots) ** copies))


def experts_op(model: ModelShape, w: LayerWork, r: Rates, kernels: int) -> Op:
    """The die's experts (grouped INT8 GEMMs): the weights of every slot that got a token, the
    copies' activations in and out."""
    params = model.expert_params
    weights = active_slots(w.expert_slots, w.expert_tokens) * params * r.weight_bytes
    acts = 2 * w.expert_tokens * model.hidden * r.act_bytes
    t = roofline(2 * w.expert_tokens * params, weights + acts, r.int8, r.hbm)
    return Op(t, kernels * r.launch_s)


def dense_ffn_op(model: ModelShape, w: LayerWork, r: Rates, kernels: int) -> Op:
    params = model.dense_ffn_params
    nbytes = params * r.weight_bytes + 2 * w.tokens * model.hidden * r.act_bytes
    return Op(roofline(2 * w.tokens * params, nbytes, r.int8, r.hbm), kernels * r.launch_s)


def head_op(model: ModelShape, tokens: float, r: Rates, kernels: int) -> Op:
    """The final norm, the LM head (INT8 GEMM over the vocabulary) and sampling."""
    params = model.head_params
    nbytes = params * r.weight_bytes + tokens * (model.hidden + model.vocab) * r.act_bytes
    return Op(roofline(2 * tokens * params, nbytes, r.int8, r.hbm), kernels * r.launch_s)


@dataclass(frozen=True)
class Stage:
    """One layer (or the head) of ONE microbatch: compute A, communication D, compute E,
    communication C, in that order. A dense layer or the head communicates nothing."""

    a: Op
    d_s: float = 0.0
    e: Op = Op(0.0, 0.0)
    c_s: float = 0.0
    repeat: int = 1  # identical layers in a row


@dataclass(frozen=True, kw_only=True)
class Schedule:
    total_s: float
    kernels_s: float  # every microbatch's kernels' roofline time
    launch_s: float  # every kernel's launch
    comm_s: float  # every collective


_LATENCY, _CORES, _COMM = 0, 1, 2  # what an operation holds: nothing, the die's cores, its UB ports


def _ops(stage: Stage, held: float) -> list[tuple[int, float]]:
    """One microbatch's operations of one layer, in order, with the resource each holds: of a
    launch, the share `held` keeps the cores (their setup and synchronisation), the rest is the
    stream's own wait (the task's issue)."""
    ops: list[tuple[int, float]] = []
    for op, comm in ((stage.a, stage.d_s), (stage.e, stage.c_s)):
        ops += [(_LATENCY, op.launch_s * (1 - held)), (_CORES, op.launch_s * held + op.kernels_s)]
        ops.append((_COMM, comm))
    return [op for op in ops if op[1] > 0]


class _Run:
    """Microbatches on their own streams sharing the die's cores and its communication: each
    stream issues its operations in order; an operation starts when its stream is ready and its
    resource is free, the earliest startable first (ties: the lower microbatch)."""

    def __init__(self, microbatches: int) -> None:
        self.ready = [0.0] * microbatches
        self.free = [0.0, 0.0, 0.0]  # per resource (latency: never busy)

    def layer(self, ops: list[tuple[int, float]]) -> None:
        nxt = [0] * len(self.ready)
        left = len(ops) * len(self.ready)
        while left:
            best, start = -1, math.inf
            for m, i in enumerate(nxt):
                if i < len(ops):
                    kind = ops[i][0]
                    at = self.ready[m] if kind == _LATENCY else max(self.ready[m], self.free[kind])
                    if at < start:
                        best, start = m, at
            kind, d = ops[nxt[best]]
            self.ready[best] = start + d
            if kind != _LATENCY:
                self.free[kind] = start + d
            nxt[best] += 1
            left -= 1

    def state(self) -> list[float]:
        return [*self.ready, self.free[_CORES], self.free[_COMM]]

    def shift(self, by: float) -> None:
        self.ready = [t + by for t in self.ready]
        self.free = [t + by for t in self.free]


def schedule(stages: Sequence[Stage], microbatches: int, *, launch_held: float) -> Schedule:
    """Run `stages` for `microbatches` equal microbatches (module docstring); `launch_held`: the
    share of a kernel launch that holds the cores (`_ops`). A stage repeated
    many times is run until its layers repeat with one period, then extrapolated. One
    microbatch: everything in series, nothing hidden."""
    kernels = launch = comm = 0.0
    for st in stages:
        n = microbatches * st.repeat
        kernels += n * (st.a.kernels_s + st.e.kernels_s)
        launch += n * (st.a.launch_s + st.e.launch_s)
        comm += n * (st.d_s + st.c_s)
    if microbatches == 1:
        total = kernels + launch + comm
        return Schedule(total_s=total, kernels_s=kernels, launch_s=launch, comm_s=comm)
    run = _Run(microbatches)
    for st in stages:
        ops = _ops(st, launch_held)
        done, before = 0, run.state()
        while done < st.repeat:
            run.layer(ops)
            done += 1
            after = run.state()
            deltas = [b - a for a, b in zip(before, after, strict=True)]
            if done >= 3 and max(deltas) - min(deltas) <= 1e-9 * max(1.0, *after):
                run.shift((st.repeat - done) * deltas[0])
                break
            before = after
    total = max(run.ready)
    return Schedule(total_s=total, kernels_s=kernels, launch_s=launch, comm_s=comm)


def slots_per_die(model: ModelShape, ep: int, profile: HardwareProfile) -> int:
    """Expert slots on each EP die in the published layouts (1 at EP320, 10 at EP32)."""
    s = profile.serving
    share = 1.0 - s.shared_slot_fraction - s.redundant_slot_fraction
    return max(1, math.ceil(model.routed_experts / share / ep - 1e-9))
