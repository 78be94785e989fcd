"""What a serving run comes to: latency percentiles (TTFT, TPOT), tokens/s per NPU, batch sizes,
the prefix-cache hit rate, EMS traffic, goodput at the deployment's SLO. Built from the engine's
events (one Recorder) and counters, the same for a simulation and a live run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.overrides import changed
from cmemu.emulator.model.serving.deployment import Deployment
from cmemu.emulator.model.serving.engine import (
    EngineStats,
    Event,
    FinishEvent,
    FinishReason,
    Request,
    TokenEvent,
)
from cmemu.emulator.model.serving.hbm import die_memory
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.workload import turn_of


class Recorder:
    """Per-request times from the engine's events."""

    def __init__(self) -> None:
        self.arrival: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.finish: dict[str, tuple[float, int]] = {}
        self.cancelled = 0
        self.failed = 0  # finished ERROR
        self.errors: dict[str, str] = {}  # request: why it finished ERROR
        self.retries = 0
        self.first_tokens = 0
        self.last_s = 0.0

    def submitted(self, request: Request) -> None:
        self.arrival[request.id] = request.arrival_s

    def record(self, event: Event) -> None:
        self.last_s = max(self.last_s, event.time_s)
        if isinstance(event, TokenEvent):
            if event.index == 0:
                self.first[event.request_id] = event.time_s
                self.first_tokens += 1
        elif isinstance(event, FinishEvent):
            if event.reason is FinishReason.CANCELLED:
                self.cancelled += 1
            elif event.reason is FinishReason.ERROR:
                self.failed += 1
                self.errors[event.request_id] = event.error
            else:
                self.finish[event.request_id] = (event.time_s, event.tokens)
        else:
            self.retries += 1

    def ttft(self) -> list[float]:
        return [t - self.arrival[r] for r, t in self.first.items() if r in self.arrival]

    def tpot(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r, (t, tokens) in self.finish.items():
            if tokens > 1 and r in self.first:
                out[r] = (t - self.first[r]) / (tokens - 1)
        return out


@dataclass(frozen=True, kw_only=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        if not values:
            return cls(p50=0.0, p90=0.0, p99=0.0, mean=0.0)
        a = np.asarray(values)
        p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
        return cls(p50=p50, p90=p90, p99=p99, mean=float(a.mean()))


@dataclass(frozen=True, kw_only=True)
class Report:
    emulated_s: float
    submitted: int
    finished: int
    cancelled: int
    output_tokens: int
    tokens_per_s: float
    tokens_per_s_per_npu: float  # all NPUs of the deployment
    decode_tokens_per_s_per_npu: float  # decode NPUs only
    prefill_tokens_per_s_per_npu: float  # prompt tokens computed, prefill NPUs only
    ttft_s: Percentiles
    tpot_s: Percentiles
    batch_per_die_mean: float
    batch_per_die_max: int
    decode_steps: int
    prefill_batches: int
    kv_hit_rate: float  # prompt blocks found in EMS / prompt blocks looked up
    prompt_tokens: int
    prefill_tokens: int
    ems_loaded_bytes: float  # matched blocks read from EMS (the others were in prefill HBM)
    prefill_hbm_hit_blocks: int  # matched blocks the prefill instance's HBM still held
    ems_stored_bytes: float
    kv_transfer_bytes: float
    slo_attainment: float  # finished requests within both targets
    goodput_per_s: float  # such requests per second
    # a decode die's HBM: do the weights fit (if not, a toy layout: KV admission is off), the
    # largest batch per die that fits at the run's mean context (prompt + output), the most one
    # die held (weights, reserve, KV caches, activations), waits for HBM, requests refused
    hbm_weights_fit: bool = True
    hbm_batch_per_die: int = 0
    hbm_peak_bytes_per_die: float = 0.0
    hbm_bytes_per_die: float = 0.0
    hbm_waits: int = 0
    hbm_refused: int = 0
    # on-demand admission (decode.admission): requests preempted to make room, and the tokens of
    # context their prefill computed again
    preemptions: int = 0
    preempted_tokens: int = 0
    # hardware figures that differ from the default profile (a what-if study): name: value
    overrides: dict[str, float] = field(default_factory=dict)
    # multi-turn conversations (workload `turns`): TTFT p50 of each turn, the first first
    ttft_p50_s_by_turn: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize(
    recorder: Recorder,
    stats: EngineStats,
    deployment: Deployment,
    elapsed_s: float,
    *,
    kv_bytes_per_block: float,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> Report:
    d = deployment
    elapsed = max(elapsed_s, 1e-12)
    output = recorder.first_tokens + stats.decode_tokens
    ttft = recorder.ttft()
    tpot = recorder.tpot()
    good = 0
    for r in recorder.finish:
        first = recorder.first.get(r)
        if first is None:
            continue
        if first - recorder.arrival.get(r, first) > d.prefill.ttft_target_s:
            continue
        if tpot.get(r, 0.0) > d.decode.tpot_target_s:
            continue
        good += 1
    decode_npus = d.decode.instances * d.decode.npus
    prefill_npus = d.prefill.instances * d.prefill.npus
    return Report(
        emulated_s=elapsed_s,
        submitted=stats.submitted,
        finished=len(recorder.finish),
        cancelled=recorder.cancelled,
        output_tokens=output,
        tokens_per_s=output / elapsed,
        tokens_per_s_per_npu=output / elapsed / d.npus,
        decode_tokens_per_s_per_npu=stats.decode_tokens / elapsed / decode_npus,
        prefill_tokens_per_s_per_npu=stats.prefill_tokens / elapsed / prefill_npus,
        ttft_s=Percentiles.of(ttft),
        tpot_s=Percentiles.of(list(tpot.values())),
        batch_per_die_mean=stats.batch_per_die_sum / max(stats.decode_steps, 1),
        batch_per_die_max=stats.batch_per_die_max,
        decode_steps=stats.decode_steps,
        prefill_batches=stats.prefill_batches,
        kv_hit_rate=stats.matched_blocks / max(stats.prompt_blocks, 1),
        prompt_tokens=stats.prompt_tokens,
        prefill_tokens=stats.prefill_tokens,
        ems_loaded_bytes=stats.ems_loaded_bytes,
        prefill_hbm_hit_blocks=stats.prefill_hbm_hit_blocks,
        ems_stored_bytes=stats.ems_stored_blocks * kv_bytes_per_block,
        kv_transfer_bytes=stats.kv_transfer_bytes,
        slo_attainment=good / max(len(recorder.finish), 1),
        goodput_per_s=good / elapsed,
        overrides=changed(profile),
        ttft_p50_s_by_turn=_by_turn(recorder),
        **_hbm(stats, deployment, profile),
    )


def _by_turn(recorder: Recorder) -> list[float]:
    """TTFT p50 per turn of a multi-turn workload's conversations (none: empty)."""
    by: dict[int, list[float]] = {}
    for rid, t in recorder.first.items():
        turn = turn_of(rid)
        if turn is not None and rid in recorder.arrival:
            by.setdefault(turn, []).append(t - recorder.arrival[rid])
    return [float(np.median(by[k])) for k in sorted(by)]


def _hbm(stats: EngineStats, d: Deployment, profile: HardwareProfile) -> dict[str, Any]:
    memory = die_memory(get_model(d.model), d.decode_ep(profile), mtp=d.decode.mtp, profile=profile)
    context = stats.context_tokens / max(stats.submitted, 1)
    return {
        "hbm_weights_fit": memory.free_bytes > 0,
        "hbm_batch_per_die": memory.max_batch(context) if stats.submitted else 0,
        "hbm_peak_bytes_per_die": memory.weights_bytes
        + memory.reserved_bytes
        + stats.kv_peak_bytes,
        "hbm_bytes_per_die": memory.hbm_bytes,
        "hbm_waits": stats.hbm_waits,
        "hbm_refused": stats.hbm_refused,
        "preemptions": stats.preemptions,
        "preempted_tokens": stats.preempted_tokens,
    }
