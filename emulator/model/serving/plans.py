"""What the serving engine and its caller exchange: requests, step plans and the caller's
measurements of them, the events a step's end emits, and the engine's counters (the engine's
module docstring says how a caller uses them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class PlanKind(StrEnum):
    LOOKUP = "lookup"
    PREFILL = "prefill"
    TRANSFER = "transfer"
    DECODE = "decode"


class FinishReason(StrEnum):
    LENGTH = "length"  # every output token emitted
    CANCELLED = "cancelled"
    ERROR = "error"  # failed after its retries (or nowhere left to run it): the caller shows it


@dataclass(frozen=True, kw_only=True)
class Request:
    """One request. `block_keys` name the prompt's full blocks of the model's block size (512
    tokens), prefix-chained: two prompts sharing a prefix share its leading keys (Mooncake
    hash_ids, or EMS PrefixKeys). Without keys no prefix can hit."""

    id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_keys: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class MoeShape:
    """The expert-parallel all-to-all a step runs on every MoE layer: one dispatch and one combine
    over `ranks` dies (the instance's first `ranks` dies in the deployment's layout order, leaving
    out the `lost` ones: see `rank_dies`), each rank sending `tokens_per_rank` tokens (per
    microbatch: with two microbatches each collective carries half the tokens and runs twice per
    layer)."""

    ranks: int
    tokens_per_rank: int
    layers: int
    microbatches: int
    lost: tuple[int, ...] = ()  # indexes of the instance's dies isolated (not taking part)


def rank_dies(dies: Sequence[str], shape: MoeShape) -> tuple[str, ...]:
    """The dies a step's collectives run over: the instance's dies (in layout order) without the
    lost ones, the first `shape.ranks` of them."""
    lost = set(shape.lost)
    return tuple(d for i, d in enumerate(dies) if i not in lost)[: shape.ranks]


@dataclass(frozen=True, kw_only=True)
class KvTransfer:
    """A KV cache from the NPU of the prefill instance's first die in service to that of the
    decode instance (`*_npu`: their indexes among the instance's NPUs)."""

    src: str  # prefill instance id
    dst: str  # decode instance id
    bytes: int
    src_npu: int = 0
    dst_npu: int = 0


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """Work the caller must time. `instance` is where it runs (for TRANSFER the source)."""

    id: int
    kind: PlanKind
    instance: str
    start_s: float
    requests: tuple[str, ...]
    moe: MoeShape | None = None  # PREFILL, DECODE
    block_keys: tuple[str, ...] = ()  # LOOKUP: keys to match; TRANSFER: new keys to store
    transfer: KvTransfer | None = None  # TRANSFER
    batch_per_die: int = 0  # DECODE: the busiest die's requests; PREFILL: tokens per die


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What the caller measured for a plan (emulated seconds). Fields a kind does not use are
    ignored."""

    dispatch_s: float = 0.0
    combine_s: float = 0.0
    matched_blocks: int = 0
    lookup_s: float = 0.0
    transfer_s: float = 0.0
    # PREFILL, DECODE: the slowest rank's compute share (a slowed NPU), in (0, 1]: the step's
    # kernels run at its pace (every layer's dispatch waits for it)
    compute_share: float = 1.0


@dataclass(frozen=True, kw_only=True)
class TokenEvent:
    """`count` output tokens of a request, numbered from `index` (0 is the first token, emitted
    by prefill: its time is the TTFT)."""

    request_id: str
    time_s: float
    index: int
    count: int


@dataclass(frozen=True, kw_only=True)
class FinishEvent:
    request_id: str
    time_s: float
    reason: FinishReason
    tokens: int  # output tokens emitted in all
    error: str = ""  # ERROR: what failed


@dataclass(frozen=True, kw_only=True)
class RetryEvent:
    """A request's step failed (or its die was lost) and it is tried again: `attempt` is its
    retry count so far (1 for the first)."""

    request_id: str
    time_s: float
    attempt: int
    reason: str


Event = TokenEvent | FinishEvent | RetryEvent


@dataclass(frozen=True, kw_only=True)
class Advance:
    events: tuple[Event, ...]
    plans: tuple[StepPlan, ...]


@dataclass
class EngineStats:
    """Counters over the engine's life, for reports."""

    submitted: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0  # finished ERROR
    retries: int = 0  # RetryEvents
    failed_steps: int = 0
    abandoned_steps: int = 0  # in flight on an instance when it lost a die
    prompt_tokens: int = 0
    prompt_blocks: int = 0  # full blocks that could have hit
    matched_blocks: int = 0
    prefill_batches: int = 0
    prefill_tokens: int = 0  # computed (prompt minus matched prefix)
    prefill_busy_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0  # output tokens from decode steps (first tokens come from prefill)
    decode_busy_s: float = 0.0
    batch_per_die_sum: int = 0  # over decode steps: the busiest die's batch
    batch_per_die_max: int = 0
    ems_loaded_bytes: float = 0.0  # matched prefix KV read from EMS (not held in prefill HBM)
    prefill_hbm_hit_blocks: int = 0  # matched blocks a prefill instance's HBM still held
    prefill_requests: dict[str, int] = field(default_factory=dict)  # prefilled, per instance
    ems_stored_blocks: int = 0  # new blocks handed to the caller to store
    kv_transfer_bytes: float = 0.0
    context_tokens: int = 0  # prompt + output tokens of every request submitted
    hbm_waits: int = 0  # times a prefilled request waited for HBM while decode slots were free
    hbm_refused: int = 0  # requests whose KV cache alone exceeds a decode die's HBM: ERROR
    kv_peak_bytes: float = 0.0  # the most HBM one decode die's requests held (KV, activations)
    preemptions: int = 0  # on-demand admission: requests put out of decode to make room
    preempted_tokens: int = 0  # their context (prompt and output so far), prefilled again
    batch_histogram: dict[int, int] = field(default_factory=dict)  # busiest die's batch: steps
