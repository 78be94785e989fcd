"""The serving engine: the one place where requests are scheduled.

A pure state machine. It decides everything a serving system decides (which prefill instance takes
a request, prefill batches, which decode instance continues it, continuous batching up to the cap
per die, cancellation) and computes every step's duration with the cost model, but it never does
I/O and never times communication itself. Instead it hands its caller *step plans* and the caller
reports back what it measured:

- LOOKUP: match a request's prompt blocks against the prefix cache (EMS MatchPrefix);
  report `matched_blocks` and `lookup_s`.
- PREFILL: one prefill batch on a prefill instance; report one MoE dispatch and one combine of
  `plan.moe` (`dispatch_s`, `combine_s`: the duration of ONE collective of that shape; the engine
  multiplies by the MoE layers and microbatches itself).
- TRANSFER: move one request's KV cache from its prefill instance to its decode instance
  (`plan.transfer`), and store the prompt's new blocks (`plan.block_keys`) in EMS; report
  `transfer_s`. Storing is off the critical path: it is not timed.
- DECODE: one decode step of a decode instance; report `dispatch_s` and `combine_s` as for PREFILL.

Failures (issue 11). A caller whose measurement failed reports `fail(plan, at_s, reason)` instead:
the step ends at `at_s` having done nothing, and every request in it counts one retry; it goes on
where it was (a decode step simply runs again, a prefill batch is queued again, a transfer waits
again) until it has failed `max_request_retries` times, when it finishes with reason ERROR (the
caller shows the error: nothing is dropped silently). A failed LOOKUP is a cache miss, not a retry.
`isolate(instance, dies, now)` takes dies out of an instance: the step in flight there is
abandoned (a later report of it is ignored); a decode instance's requests holding KV on a lost die
are prefilled again (prompt and the tokens emitted so far; their tokens continue where they
stopped) elsewhere, each counting a retry; its lost dies' experts move to redundant slots
(placement.remap) and its steps are costed over the surviving dies at the remapped imbalance. A
prefill instance that lost a die stops taking batches until restored: its queue moves to the
others (with none left, those requests and new ones finish ERROR at once: `accepting()` says so;
likewise prefilled requests when no decode instance has a die left in service).
`restore(instance, dies, now)` brings the dies back at the original placement.

The discrete-event simulator answers from pure models, the live driver from the real fabric and
EMS; the engine is the same, so the two agree by construction.

Time: emulated seconds as floats, on the caller's clock (the simulator starts at 0.0; the live
driver passes the fabric's emulated time in seconds). A caller loop:

    engine.submit(request, now)               # any time
    step = engine.advance(now)                # events up to now, and the plans that start now
    for plan in step.plans:
        engine.report(plan.id, measure(plan))  # fixes that step's end time
    later = engine.next_due_time()            # advance() again at that time (or on a submit)
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
)
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.serving import cost
from emulator.model.serving.deployment import Deployment
from emulator.model.serving.experts import placement
from emulator.model.serving.hbm import GB, die_memory
from emulator.model.serving.models import get_model
from emulator.model.serving.placement import ExpertPlacement, Remap, remap
from emulator.model.serving.router import ROUTERS, Load, RouterState


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
    ems_loaded_bytes: float = 0.0  # matched prefix KV read from EMS
    ems_stored_blocks: int = 0  # new blocks handed to the caller to store
    kv_transfer_bytes: float = 0.0
    context_tokens: int = 0  # prompt + output tokens of every request submitted
    hbm_waits: int = 0  # times a prefilled request waited for HBM while decode slots were free
    hbm_refused: int = 0  # requests whose KV cache alone exceeds a decode die's HBM: ERROR
    kv_peak_bytes: float = 0.0  # the most HBM one decode die's requests held (KV, activations)
    batch_histogram: dict[int, int] = field(default_factory=dict)  # busiest die's batch: steps


class _Stage(StrEnum):
    NEW = "new"
    LOOKUP = "lookup"
    QUEUED = "queued"
    PREFILL = "prefill"
    WAITING = "waiting"  # prefilled, waiting for a decode slot
    TRANSFER = "transfer"
    DECODE = "decode"


@dataclass
class _Req:
    request: Request
    prefill: str
    stage: _Stage = _Stage.NEW
    matched_blocks: int = 0
    decode: str = ""
    slot: int = -1
    resume: int = 0  # output tokens emitted before its KV was lost: prefill continues from here
    retries: int = 0


@dataclass
class _Step:
    plan: StepPlan
    end_s: float | None = None
    batch: int = 0  # DECODE: the busiest die's requests
    kv: float = 0.0  # DECODE: mean context
    tokens: int = 0  # PREFILL: tokens computed
    pairs: float = 0.0  # PREFILL: causal attention pairs
    requests: int = 0  # PREFILL
    loaded: float = 0.0  # PREFILL: prefix KV bytes read from EMS
    matched: int = 0  # LOOKUP
    dies: int = 0  # DECODE: the dies, EP degree and imbalance it is costed at
    ep: int = 0
    imbalance: float = 1.0
    failed: str = ""  # reported failed: why
    abandoned: bool = False  # its instance lost a die meanwhile: it ends with no effect


NO_DECODE = "no decode instance is in service (its dies are lost)"
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
_INF = float("inf")


class _Decode:
    """A decode instance's slots: max_batch_per_die x dies, slot i on die i % dies. Per-request
    counters live in arrays so that a step over 15,000 requests is a few vector operations."""

    def __init__(
        self,
        name: str,
        dies: int,
        per_die: int,
        experts: ExpertPlacement,
        imbalance: float,
        *,
        kv_budget: float | None = None,
    ) -> None:
        self.name = name
        # HBM each die has for KV caches and activations (None: not enforced, see hbm.py)
        self.kv_budget = kv_budget
        self.dies = dies
        self.slots_per_die = per_die
        self.ep0 = len(experts.dies)  # the expert-parallel group: the first ep0 dies
        self.experts = experts  # over d0..d{ep0-1}
        self.imbalance0 = imbalance
        self.imbalance = imbalance
        self.remap: Remap | None = None
        self.lost: set[int] = set()
        n = dies * per_die
        self.ids: list[str] = [""] * n
        self.active = np.zeros(n, dtype=bool)  # in the batch
        self.emitted = np.zeros(n, dtype=np.int64)
        self.target = np.zeros(n, dtype=np.int64)
        self.context = np.zeros(n, dtype=np.int64)  # prompt tokens
        self.credit = np.zeros(n, dtype=np.float64)
        self.per_die = np.zeros(dies, dtype=np.int64)
        self.need = np.zeros(n, dtype=np.float64)  # HBM bytes each slot's request holds
        self.kv_used = np.zeros(dies, dtype=np.float64)
        self.kv_peak = 0.0  # the most HBM bytes one die's requests held
        # lowest level first, so that filling keeps the dies even
        self.free: list[int] = list(range(n))
        heapq.heapify(self.free)
        self.reserved = 0  # slots taken by transfers in flight or joined
        self.n_active = 0
        self.busy: int | None = None
        self.joining: list[int] = []

    @property
    def capacity(self) -> int:
        return len(self.ids) - len(self.lost) * self.slots_per_die

    @property
    def alive(self) -> int:
        return self.dies - len(self.lost)

    @property
    def ep(self) -> int:
        return self.ep0 - sum(1 for d in self.lost if d < self.ep0)

    def fits(self, need: float) -> bool:
        """Whether some die in service has a free slot and `need` bytes of HBM left."""
        if not self.free:
            return False
        if self.kv_budget is None:
            return True
        room = (self.per_die < self.slots_per_die) & (self.kv_used + need <= self.kv_budget)
        if self.lost:
            room[list(self.lost)] = False
        return bool(room.any())

    def take(self, need: float = 0.0) -> int:
        """The lowest free slot (so filling keeps the dies level) on a die with `need` bytes of
        HBM left: the caller checked `fits(need)`."""
        slot = self.free[0]
        die = slot % self.dies
        if self.kv_budget is None or self.kv_used[die] + need <= self.kv_budget:
            heapq.heappop(self.free)
        else:  # the lowest slot's die is full: the lowest slot on a die with room
            free = np.fromiter(self.free, dtype=np.int64, count=len(self.free))
            ok = self.kv_used[free % self.dies] + need <= self.kv_budget
            slot = int(free[ok].min())
            die = slot % self.dies
            self.free.remove(slot)
            heapq.heapify(self.free)
        self.reserved += 1
        self.per_die[die] += 1
        self.need[slot] = need
        self.kv_used[die] += need
        self.kv_peak = max(self.kv_peak, float(self.kv_used[die]))
        return slot

    def release(self, slot: int) -> None:
        if self.active[slot]:
            self.n_active -= 1
        self.active[slot] = False
        self.ids[slot] = ""
        self.per_die[slot % self.dies] -= 1
        self.kv_used[slot % self.dies] -= self.need[slot]
        self.need[slot] = 0.0
        self.reserved -= 1
        if slot % self.dies not in self.lost:
            heapq.heappush(self.free, slot)

    def lose(self, dies: Collection[int]) -> list[int]:
        """Take dies out: their free slots go, the slots held there are returned (to requeue)."""
        self.lost |= set(dies)
        self.free = [s for s in self.free if s % self.dies not in self.lost]
        heapq.heapify(self.free)
        held = [s for s in range(len(self.ids)) if self.ids[s] and s % self.dies in dies]
        self._remap()
        return held

    def regain(self, dies: Collection[int]) -> None:
        back = set(dies) & self.lost
        self.lost -= back
        for s in range(len(self.ids)):
            if s % self.dies in back and not self.ids[s]:
                heapq.heappush(self.free, s)
        self._remap()

    def _remap(self) -> None:
        lost = [f"d{d}" for d in sorted(self.lost) if d < self.ep0]
        if not lost or len(lost) == self.ep0:  # all lost: nothing runs here until restored
            self.remap, self.imbalance = None, self.imbalance0
        else:
            self.remap = remap(self.experts, lost)
            self.imbalance = max(1.0, self.remap.placement.imbalance)


@dataclass
class _Prefill:
    name: str
    queue: deque[str] = field(default_factory=deque)
    queued_tokens: int = 0
    busy: int | None = None
    lost: set[int] = field(default_factory=set)  # isolated dies: no batches until restored


class Engine:
    """See the module docstring. Not thread-safe; one caller drives it.

    `stream_tokens=False` emits only each request's first token and its finish (what a report
    needs), not a TokenEvent per request per decode step: the simulator's fast path."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        profile: HardwareProfile = DEFAULT_PROFILE,
        stream_tokens: bool = True,
    ) -> None:
        self.deployment = deployment
        self.profile = profile
        self.model = get_model(deployment.model)
        self.stream_tokens = stream_tokens
        self.stats = EngineStats()
        d = deployment
        self._router = ROUTERS[d.router]
        self._route_state = RouterState()
        self._decode_dies = d.decode_dies(profile)
        self._prefill_dies = d.prefill_dies(profile)
        self._decode_ep = d.decode_ep(profile)
        self._prefill_ep = d.prefill_ep(profile)
        experts = placement(self.model, self._decode_ep, d.placement, profile)
        self._decode_imbalance = 1.0 if d.placement == "ideal" else max(1.0, experts.imbalance)
        prefill_experts = placement(self.model, self._prefill_ep, d.placement, profile)
        self._prefill_imbalance = (
            1.0 if d.placement == "ideal" else max(1.0, prefill_experts.imbalance)
        )
        self.max_retries = profile.serving.max_request_retries
        self._tokens_per_step = profile.serving.mtp_tokens_per_step if d.decode.mtp else 1.0
        self._block = profile.serving.block_tokens
        self._kv_per_token = cost.kv_bytes_per_token(self.model, profile)
        self.memory = die_memory(self.model, self._decode_ep, mtp=d.decode.mtp, profile=profile)
        # a deployment whose weights alone overflow a die (the cm-mini toy layouts) is not held
        # to its HBM; the report says so (Report.hbm_weights_fit)
        budget = self.memory.free_bytes if self.memory.free_bytes > 0 else None
        self._kv_budget = budget
        self._decodes = {
            i: _Decode(
                i,
                self._decode_dies,
                d.decode.max_batch_per_die,
                experts,
                self._decode_imbalance,
                kv_budget=budget,
            )
            for i in d.decode_ids()
        }
        self._prefills = {i: _Prefill(i) for i in d.prefill_ids()}
        self._reqs: dict[str, _Req] = {}
        self._new: list[str] = []
        self._waiting: deque[str] = deque()
        self._steps: dict[int, _Step] = {}
        self._due: list[tuple[float, int]] = []
        self._events: list[Event] = []
        self._next_plan = 0
        self._dirty_prefill: set[str] = set()  # may start a batch: queue grew or it went idle
        self._dirty_decode: set[str] = set()  # may start a step: someone joined or it went idle
        self._slots_dirty = False  # a decode slot was freed or a request began waiting

    # --- the public API --------------------------------------------------------------------

    def submit(self, request: Request, now_s: float) -> None:
        """Accept a request (InvalidArgumentError for a bad or repeated one). Its first plan comes
        from the next advance()."""
        if not request.id:
            raise InvalidArgumentError("a request needs an id", field="id")
        if request.id in self._reqs:
            raise InvalidArgumentError(
                f"request {request.id!r} is already in flight", field="id", subject=request.id
            )
        if request.input_tokens < 1 or request.output_tokens < 1:
            raise InvalidArgumentError(
                "input_tokens and output_tokens must be >= 1",
                field="input_tokens",
                subject=request.id,
            )
        blocks = request.input_tokens // self._block
        if len(request.block_keys) > blocks:
            raise InvalidArgumentError(
                f"{len(request.block_keys)} block keys for {blocks} full blocks of "
                f"{self._block} tokens",
                field="block_keys",
                subject=request.id,
            )
        home = self._route_prefill(request)
        self.stats.submitted += 1
        self.stats.context_tokens += request.input_tokens + request.output_tokens
        req = _Req(request=request, prefill=home or "")
        why = self._unavailable()
        if why is not None:  # accepted, and failed at once: the caller shows the error
            self._fail(req, now_s, why)
            return
        assert home is not None
        self._reqs[request.id] = req
        self._new.append(request.id)

    def cancel(self, request_id: str, now_s: float) -> bool:
        """Drop a request wherever it is and free its KV; its FinishEvent (CANCELLED) comes from
        the next advance(). False when it is unknown or already finished."""
        req = self._reqs.pop(request_id, None)
        if req is None:
            return False
        emitted = self._drop(req)
        self.stats.cancelled += 1
        self._events.append(
            FinishEvent(
                request_id=request_id, time_s=now_s, reason=FinishReason.CANCELLED, tokens=emitted
            )
        )
        return True

    def _drop(self, req: _Req) -> int:
        """Take a request (already out of `_reqs`) out of wherever it waits or holds a slot;
        the output tokens it had emitted."""
        request_id = req.request.id
        emitted = req.resume
        if req.stage is _Stage.QUEUED:
            home = self._prefills[req.prefill]
            home.queue.remove(request_id)
            home.queued_tokens -= self._new_tokens(req)
        elif req.stage is _Stage.NEW:
            self._new.remove(request_id)
        elif req.stage is _Stage.WAITING:
            self._waiting.remove(request_id)
            emitted = req.resume + 1
        elif req.stage in (_Stage.TRANSFER, _Stage.DECODE):
            inst = self._decodes[req.decode]
            emitted = int(inst.emitted[req.slot])
            if req.slot in inst.joining:
                inst.joining.remove(req.slot)
            inst.release(req.slot)
            self._slots_dirty = True
        # LOOKUP and PREFILL: the step in flight finds the request gone and skips it
        return emitted

    def report(self, plan_id: int, result: StepResult) -> None:
        """The caller's measurements for a plan: fixes the step's end time."""
        step = self._unreported(plan_id)
        if step.abandoned:  # its instance lost a die meanwhile: nothing to time
            del self._steps[plan_id]
            return
        r = result
        if not (
            0 <= r.dispatch_s < _INF
            and 0 <= r.combine_s < _INF
            and 0 <= r.lookup_s < _INF
            and 0 <= r.transfer_s < _INF
        ):
            for name in ("dispatch_s", "combine_s", "lookup_s", "transfer_s"):
                value = getattr(result, name)
                if not (value >= 0 and math.isfinite(value)):
                    raise InvalidArgumentError(f"{name} must be finite and >= 0", field=name)
        if result.matched_blocks < 0:
            raise InvalidArgumentError("matched_blocks must be >= 0", field="matched_blocks")
        if not 0 < result.compute_share <= 1:
            raise InvalidArgumentError("compute_share must be in (0, 1]", field="compute_share")
        step.end_s = step.plan.start_s + self._duration(step, result)
        heapq.heappush(self._due, (step.end_s, plan_id))

    def _unreported(self, plan_id: int) -> _Step:
        step = self._steps.get(plan_id)
        if step is None:
            raise NotFoundError(f"no plan {plan_id} in flight", subject=str(plan_id))
        if step.end_s is not None:
            raise PreconditionError(f"plan {plan_id} was reported already", subject=str(plan_id))
        return step

    def fail(self, plan_id: int, at_s: float, reason: str) -> None:
        """The caller could not carry a plan out (a fault): the step ends at `at_s` (not before
        it started) having done nothing, and its requests count a retry (module docstring)."""
        step = self._unreported(plan_id)
        if step.abandoned:
            del self._steps[plan_id]
            return
        if not math.isfinite(at_s):
            raise InvalidArgumentError("at_s must be finite", field="at_s")
        step.failed = reason or "the step failed"
        step.end_s = max(at_s, step.plan.start_s)
        self.stats.failed_steps += 1
        heapq.heappush(self._due, (step.end_s, plan_id))

    def isolate(self, instance: str, dies: Collection[int], now_s: float) -> tuple[int, ...]:
        """Take `dies` (indexes in the instance's layout order) out of `instance` at `now_s`;
        the plans abandoned (a later report or fail of them is ignored)."""
        lost = self._dies(instance, dies)
        dec = self._decodes.get(instance)
        if dec is not None:
            return self._isolate_decode(dec, lost, now_s)
        return self._isolate_prefill(self._prefills[instance], lost, now_s)

    def _isolate_decode(self, dec: _Decode, lost: set[int], now_s: float) -> tuple[int, ...]:
        instance = dec.name
        abandoned: list[int] = []
        fresh = lost - dec.lost
        if fresh:
            if dec.busy is not None:
                abandoned.append(self._abandon(dec.busy))
                dec.busy = None
            held = dec.lose(fresh)
            for step in list(self._steps.values()):  # transfers into a lost slot start over
                t = step.plan.transfer
                if t is not None and t.dst == instance and not step.abandoned:
                    req = self._reqs.get(step.plan.requests[0])
                    if req is not None and req.slot % dec.dies in fresh:
                        abandoned.append(self._abandon(step.plan.id))
                        held.remove(req.slot)
                        dec.release(req.slot)
                        req.stage, req.decode, req.slot = _Stage.WAITING, "", -1
                        self._waiting.appendleft(req.request.id)
            for slot in held:
                rid = dec.ids[slot]
                req = self._reqs[rid]
                req.resume = int(dec.emitted[slot])
                if slot in dec.joining:
                    dec.joining.remove(slot)
                dec.release(slot)
                req.stage, req.decode, req.slot = _Stage.NEW, "", -1
                if self._retry(req, now_s, f"its KV cache was on a lost die of {instance}"):
                    self._new.append(rid)
            self._dirty_decode.add(instance)
            self._slots_dirty = True
        return tuple(abandoned)

    def _isolate_prefill(self, pre: _Prefill, lost: set[int], now_s: float) -> tuple[int, ...]:
        instance = pre.name
        abandoned: list[int] = []
        fresh = lost - pre.lost
        if not fresh:
            return ()
        pre.lost |= fresh
        if pre.busy is not None:
            step = self._steps[pre.busy]
            abandoned.append(self._abandon(pre.busy))
            pre.busy = None
            for rid in step.plan.requests:
                req = self._reqs.get(rid)
                if req is not None and self._retry(req, now_s, f"{instance} lost a die"):
                    self._enqueue(req, now_s)
        for step in list(self._steps.values()):  # KV caches still on the instance are gone
            t = step.plan.transfer
            if t is not None and t.src == instance and not step.abandoned:
                abandoned.append(self._abandon(step.plan.id))
                req = self._reqs.get(step.plan.requests[0])
                if req is not None:
                    dec = self._decodes[req.decode]
                    dec.release(req.slot)
                    self._slots_dirty = True
                    self._prefill_again(req, now_s, f"its KV cache was on {instance}")
        for rid in [r for r in self._waiting if self._reqs[r].prefill == instance]:
            self._waiting.remove(rid)
            self._prefill_again(self._reqs[rid], now_s, f"its KV cache was on {instance}")
        queued = [self._reqs[rid] for rid in pre.queue]
        pre.queue.clear()
        pre.queued_tokens = 0
        for req in queued:
            self._enqueue(req, now_s)
        return tuple(abandoned)

    def restore(self, instance: str, dies: Collection[int], now_s: float) -> None:
        """Bring isolated dies of `instance` back (replaced, their weights loaded)."""
        back = self._dies(instance, dies)
        dec = self._decodes.get(instance)
        if dec is not None:
            dec.regain(back)
            self._dirty_decode.add(instance)
            self._slots_dirty = True
            return
        pre = self._prefills[instance]
        pre.lost -= back
        self._dirty_prefill.add(instance)

    def _dies(self, instance: str, dies: Collection[int]) -> set[int]:
        dec = self._decodes.get(instance)
        if dec is None and instance not in self._prefills:
            known = [*self._decodes, *self._prefills]
            raise NotFoundError(
                f"no instance {instance!r}; known: {', '.join(known)}",
                field="instance",
                subject=instance,
            )
        count = dec.dies if dec is not None else self._prefill_dies
        bad = [d for d in dies if not 0 <= d < count]
        if bad:
            raise InvalidArgumentError(
                f"{instance} has dies 0..{count - 1}, not {bad[0]}", field="dies", subject=instance
            )
        return set(dies)

    def _prefill_again(self, req: _Req, now_s: float, reason: str) -> None:
        """A prefilled request whose KV cache was lost before it reached decode: its first token
        is out, so it is prefilled again from the one after."""
        req.resume += 1
        req.stage, req.decode, req.slot = _Stage.NEW, "", -1
        if self._retry(req, now_s, reason):
            self._new.append(req.request.id)

    def _first_npu(self, lost: set[int]) -> int:
        """The NPU of an instance's first die in service."""
        die = 0
        while die in lost:
            die += 1
        return die // self.profile.npu.dies

    def _abandon(self, plan_id: int) -> int:
        step = self._steps[plan_id]
        step.abandoned = True
        self.stats.abandoned_steps += 1
        return plan_id

    def _retry(self, req: _Req, now_s: float, reason: str, tokens: int | None = None) -> bool:
        """Count a retry of `req`; False (and it finished ERROR, having emitted `tokens`, by
        default `req.resume`) when it has none left."""
        req.retries += 1
        rid = req.request.id
        if req.retries > self.max_retries:
            self._fail(req, now_s, f"{reason}; failed {req.retries} times", tokens)
            return False
        self.stats.retries += 1
        self._events.append(
            RetryEvent(request_id=rid, time_s=now_s, attempt=req.retries, reason=reason)
        )
        return True

    def _fail(self, req: _Req, now_s: float, reason: str, tokens: int | None = None) -> None:
        """Finish a request ERROR (its stage already left: `_drop` first where it still holds
        something)."""
        self._reqs.pop(req.request.id, None)
        self.stats.failed += 1
        self._events.append(
            FinishEvent(
                request_id=req.request.id,
                time_s=now_s,
                reason=FinishReason.ERROR,
                tokens=req.resume if tokens is None else tokens,
                error=reason,
            )
        )

    def accepting(self) -> bool:
        """Whether a new request has a prefill and a decode instance to go to."""
        return self._unavailable() is None

    def _unavailable(self) -> str | None:
        """Why no request can be served now (None: it can)."""
        if all(p.lost for p in self._prefills.values()):
            return "no prefill instance is in service (a lost die is replaced)"
        if not self._decoding():
            return NO_DECODE
        return None

    def _decoding(self) -> bool:
        return any(d.capacity > 0 and d.ep > 0 for d in self._decodes.values())

    def isolated(self) -> dict[str, tuple[int, ...]]:
        """Each instance's isolated dies (instances without any left out)."""
        out = {n: tuple(sorted(d.lost)) for n, d in self._decodes.items() if d.lost}
        out.update({n: tuple(sorted(p.lost)) for n, p in self._prefills.items() if p.lost})
        return out

    def remapped(self, instance: str) -> Remap | None:
        """A decode instance's expert placement after its lost dies (None: as deployed)."""
        dec = self._decodes.get(instance)
        return None if dec is None else dec.remap

    def imbalance(self, instance: str) -> float:
        """The imbalance a decode instance's steps are costed at now."""
        return self._decodes[instance].imbalance

    def knows(self, request_id: str) -> bool:
        return request_id in self._reqs

    def next_due_time(self) -> float | None:
        """The earliest emulated time at which advance() has something to do (a step ends), or
        None when nothing is pending. Plans not yet reported do not count; neither do new
        submissions (advance() at once starts them)."""
        return self._due[0][0] if self._due else None

    def advance(self, now_s: float) -> Advance:
        """Finish everything due at or before `now_s` (emitting its events with their exact
        times) and start what can start now (returning those plans)."""
        while self._due and self._due[0][0] <= now_s:
            end_s, plan_id = heapq.heappop(self._due)
            step = self._steps.pop(plan_id)
            if step.abandoned:
                continue
            if step.failed:
                self._failed(step, end_s)
            else:
                self._complete(step, end_s)
        plans = self._start(now_s)
        events, self._events = self._events, []
        if len(events) > 1:
            events.sort(key=lambda e: e.time_s)
        return Advance(events=tuple(events), plans=tuple(plans))

    @property
    def in_flight(self) -> int:
        """Requests accepted and neither finished nor cancelled."""
        return len(self._reqs)

    def decode_load(self) -> dict[str, tuple[int, int]]:
        """Each decode instance's (slots held, capacity): what a KV-aware router looks at."""
        return {n: (d.reserved, d.capacity) for n, d in self._decodes.items()}

    # --- durations ---------------------------------------------------------------------------

    def _duration(self, step: _Step, result: StepResult) -> float:
        plan = step.plan
        if plan.kind is PlanKind.LOOKUP:
            step.matched = result.matched_blocks
            return result.lookup_s
        if plan.kind is PlanKind.TRANSFER:
            return result.transfer_s
        d = self.deployment
        if plan.kind is PlanKind.DECODE:
            t = cost.decode_step(
                self.model,
                batch_per_die=step.batch,
                kv_tokens=step.kv,
                mtp=d.decode.mtp,
                microbatches=d.decode.microbatches,
                imbalance=step.imbalance,
                dies=step.dies,
                ep=step.ep,
                dispatch_s=result.dispatch_s,
                combine_s=result.combine_s,
                profile=self.profile,
                compute_share=result.compute_share,
            )
            self.stats.decode_busy_s += t.total_s
            return t.total_s
        dies = self._prefill_dies
        t = cost.prefill_batch(
            self.model,
            tokens_per_die=step.tokens / dies,
            attention_pairs_per_die=step.pairs / dies,
            requests_per_die=step.requests / dies,
            loaded_bytes_per_die=step.loaded / dies,
            microbatches=d.prefill.microbatches,
            imbalance=self._prefill_imbalance,
            dies=dies,
            ep=self._prefill_ep,
            dispatch_s=result.dispatch_s,
            combine_s=result.combine_s,
            profile=self.profile,
            compute_share=result.compute_share,
        )
        self.stats.prefill_busy_s += t.total_s
        return t.total_s

    # --- completing steps -----------------------------------------------------------------

    def _complete(self, step: _Step, end_s: float) -> None:
        kind = step.plan.kind
        if kind is PlanKind.LOOKUP:
            self._looked_up(step, end_s)
        elif kind is PlanKind.PREFILL:
            self._prefilled(step, end_s)
        elif kind is PlanKind.TRANSFER:
            self._transferred(step)
        else:
            self._decoded(step, end_s)

    def _new_tokens(self, req: _Req) -> int:
        """Tokens a prefill computes: the prompt (and, after a lost KV cache, the output so far)
        beyond the matched prefix."""
        return req.request.input_tokens + req.resume - req.matched_blocks * self._block

    def _route_prefill(self, request: Request) -> str | None:
        loads = [
            Load(instance=p.name, queued=p.queued_tokens)
            for p in self._prefills.values()
            if not p.lost
        ]
        if not loads:
            return None
        return self._router.prefill(
            request.block_keys, loads, self.deployment.prefill.batch_tokens, self._route_state
        )

    def _enqueue(self, req: _Req, now_s: float) -> None:
        """Queue a request on its prefill instance (another one when that one lost a die; with
        none in service it fails)."""
        if self._prefills[req.prefill].lost:
            home = self._route_prefill(req.request)
            if home is None:
                self._fail(req, now_s, "no prefill instance is in service")
                return
            req.prefill = home
        req.stage = _Stage.QUEUED
        home_inst = self._prefills[req.prefill]
        home_inst.queue.append(req.request.id)
        home_inst.queued_tokens += self._new_tokens(req)
        self._dirty_prefill.add(home_inst.name)

    def _failed(self, step: _Step, end_s: float) -> None:
        """A step reported failed ends: its requests retry where they were, or fail."""
        plan = step.plan
        why = f"{plan.kind.value} step on {plan.instance} failed: {step.failed}"
        if plan.kind is PlanKind.LOOKUP:  # the prefix cache is an optimisation: a miss
            step.matched = 0
            self._looked_up(step, end_s)
            return
        if plan.kind is PlanKind.PREFILL:
            inst = self._prefills[plan.instance]
            inst.busy = None
            self._dirty_prefill.add(inst.name)
            again = []
            for rid in plan.requests:
                req = self._reqs.get(rid)
                if req is not None and self._retry(req, end_s, why):
                    again.append(req)
            for req in reversed(again):  # first in line again, in their order
                req.stage = _Stage.QUEUED
                inst.queue.appendleft(req.request.id)
                inst.queued_tokens += self._new_tokens(req)
            return
        if plan.kind is PlanKind.TRANSFER:
            req = self._reqs.get(plan.requests[0])
            if req is None:
                return
            self._decodes[req.decode].release(req.slot)
            self._slots_dirty = True
            req.stage, req.decode, req.slot = _Stage.WAITING, "", -1
            if self._retry(req, end_s, why, tokens=req.resume + 1):
                self._waiting.appendleft(req.request.id)
            return
        dec = self._decodes[plan.instance]
        dec.busy = None
        self._dirty_decode.add(dec.name)
        for slot in np.flatnonzero(dec.active).tolist():
            req = self._reqs[dec.ids[slot]]
            req.resume = int(dec.emitted[slot])  # what an ERROR finish reports
            if not self._retry(req, end_s, why):
                dec.release(slot)
                self._slots_dirty = True

    def _looked_up(self, step: _Step, end_s: float) -> None:
        rid = step.plan.requests[0]
        req = self._reqs.get(rid)
        if req is None:
            return
        keys = len(req.request.block_keys)
        # at least one token is computed: the last block is recomputed when all of them hit
        most = min(keys, (req.request.input_tokens - 1) // self._block)
        req.matched_blocks = min(step.matched, most)
        self.stats.matched_blocks += req.matched_blocks
        self._enqueue(req, end_s)

    def _prefilled(self, step: _Step, end_s: float) -> None:
        self._prefills[step.plan.instance].busy = None
        self._dirty_prefill.add(step.plan.instance)
        for rid in step.plan.requests:
            req = self._reqs.get(rid)
            if req is None:
                continue
            index = req.resume
            self._events.append(TokenEvent(request_id=rid, time_s=end_s, index=index, count=1))
            if req.request.output_tokens <= index + 1:
                self._finish(rid, end_s, index + 1)
                continue
            req.stage = _Stage.WAITING
            self._waiting.append(rid)
            self._slots_dirty = True

    def _transferred(self, step: _Step) -> None:
        rid = step.plan.requests[0]
        req = self._reqs.get(rid)
        if req is None:
            return
        req.stage = _Stage.DECODE
        self._decodes[req.decode].joining.append(req.slot)
        self._dirty_decode.add(req.decode)

    def _decoded(self, step: _Step, end_s: float) -> None:
        inst = self._decodes[step.plan.instance]
        inst.busy = None
        self._dirty_decode.add(inst.name)
        slots = np.flatnonzero(inst.active)
        if slots.size == 0:
            return
        inst.credit[slots] += self._tokens_per_step
        made = np.floor(inst.credit[slots] + 1e-9).astype(np.int64)
        inst.credit[slots] -= made
        left = inst.target[slots] - inst.emitted[slots]
        made = np.minimum(made, left)
        first = inst.emitted[slots].copy()
        inst.emitted[slots] += made
        self.stats.decode_tokens += int(made.sum())
        if self.stream_tokens:
            for slot, start, n in zip(slots.tolist(), first.tolist(), made.tolist(), strict=True):
                if n:
                    self._events.append(
                        TokenEvent(request_id=inst.ids[slot], time_s=end_s, index=start, count=n)
                    )
        done = slots[inst.emitted[slots] >= inst.target[slots]]
        self._slots_dirty |= done.size > 0
        for slot in done.tolist():
            rid = inst.ids[slot]
            inst.release(slot)
            self._finish(rid, end_s, int(inst.emitted[slot]))

    def _finish(self, rid: str, end_s: float, tokens: int) -> None:
        self._reqs.pop(rid, None)
        self.stats.finished += 1
        self._events.append(
            FinishEvent(request_id=rid, time_s=end_s, reason=FinishReason.LENGTH, tokens=tokens)
        )

    # --- starting steps -------------------------------------------------------------------

    def _plan(self, **kwargs: object) -> StepPlan:
        plan = StepPlan(id=self._next_plan, **kwargs)  # type: ignore[arg-type]
        self._next_plan += 1
        return plan

    def _start(self, now_s: float) -> list[StepPlan]:
        plans: list[StepPlan] = []
        lookups = self.deployment.ems.enabled
        for rid in self._new:
            req = self._reqs[rid]
            self.stats.prompt_tokens += req.request.input_tokens
            self.stats.prompt_blocks += len(req.request.block_keys)
            if lookups and req.request.block_keys:
                req.stage = _Stage.LOOKUP
                plan = self._plan(
                    kind=PlanKind.LOOKUP,
                    instance=req.prefill,
                    start_s=now_s,
                    requests=(rid,),
                    block_keys=req.request.block_keys,
                )
                self._steps[plan.id] = _Step(plan)
                plans.append(plan)
            else:
                self._enqueue(req, now_s)
        self._new = []
        # only instances whose state changed can start something (in instance order)
        if self._dirty_prefill:
            for inst in self._prefills.values():
                ready = inst.busy is None and inst.queue and not inst.lost
                if inst.name in self._dirty_prefill and ready:
                    plans.append(self._start_prefill(inst, now_s))
            self._dirty_prefill.clear()
        if self._waiting and self._slots_dirty:
            while self._waiting and not self._decoding():  # nowhere to go: fail, not wait
                req = self._reqs[self._waiting.popleft()]
                self._fail(req, now_s, NO_DECODE, req.resume + 1)
            plans += self._start_transfers(now_s)
            self._slots_dirty = False
        if self._dirty_decode:
            for dec in self._decodes.values():
                startable = dec.busy is None and (dec.joining or dec.n_active) and dec.ep > 0
                if dec.name in self._dirty_decode and startable:
                    plans.append(self._start_decode(dec, now_s))
            self._dirty_decode.clear()
        return plans

    def _start_prefill(self, inst: _Prefill, now_s: float) -> StepPlan:
        budget = self.deployment.prefill.batch_tokens
        batch: list[str] = []
        tokens = 0
        pairs = 0.0
        loaded = 0.0
        while inst.queue:
            req = self._reqs[inst.queue[0]]
            new = self._new_tokens(req)
            if batch and tokens + new > budget:
                break
            inst.queue.popleft()
            inst.queued_tokens -= new
            req.stage = _Stage.PREFILL
            batch.append(req.request.id)
            prefix = req.matched_blocks * self._block
            tokens += new
            pairs += new * (prefix + (new + 1) / 2)
            loaded += prefix * self._kv_per_token
        s = self.stats
        s.prefill_batches += 1
        s.prefill_tokens += tokens
        s.ems_loaded_bytes += loaded
        dies = self._prefill_dies
        per_die = math.ceil(tokens / dies)
        micro = self.deployment.prefill.microbatches
        plan = self._plan(
            kind=PlanKind.PREFILL,
            instance=inst.name,
            start_s=now_s,
            requests=tuple(batch),
            moe=MoeShape(
                ranks=self._prefill_ep,
                tokens_per_rank=cost.prefill_tokens_per_rank(
                    tokens_per_die=per_die, microbatches=micro, dies=dies, ep=self._prefill_ep
                ),
                layers=self.model.moe_layers,
                microbatches=micro,
            ),
            batch_per_die=per_die,
        )
        self._steps[plan.id] = _Step(
            plan, tokens=tokens, pairs=pairs, requests=len(batch), loaded=loaded
        )
        inst.busy = plan.id
        return plan

    def _start_transfers(self, now_s: float) -> list[StepPlan]:
        plans: list[StepPlan] = []
        while self._waiting:
            req = self._reqs[self._waiting[0]]
            r = req.request
            need = self.memory.request_bytes(r.input_tokens + r.output_tokens)
            budget = self._kv_budget
            if budget is not None and need > budget:  # no die could ever hold it: an error
                self._waiting.popleft()
                self.stats.hbm_refused += 1
                self._fail(
                    req,
                    now_s,
                    f"its KV cache ({need / GB:.1f} GB for {r.input_tokens + r.output_tokens} "
                    f"tokens) exceeds a decode die's free HBM ({budget / GB:.1f} GB)",
                    req.resume + 1,
                )
                continue
            loads = [
                Load(
                    instance=d.name,
                    queued=d.reserved,
                    free=d.capacity - d.reserved if d.fits(need) else 0,
                )
                for d in self._decodes.values()
            ]
            target = self._router.decode(loads, self._route_state)
            if target is None:
                if any(d.capacity > d.reserved for d in self._decodes.values()):
                    self.stats.hbm_waits += 1
                break
            rid = self._waiting.popleft()
            inst = self._decodes[target]
            slot = inst.take(need)
            self.stats.kv_peak_bytes = max(self.stats.kv_peak_bytes, inst.kv_peak)
            inst.ids[slot] = rid
            inst.emitted[slot] = req.resume + 1
            inst.target[slot] = r.output_tokens
            inst.context[slot] = r.input_tokens
            inst.credit[slot] = 0.0
            req.stage, req.decode, req.slot = _Stage.TRANSFER, target, slot
            nbytes = int((r.input_tokens + req.resume) * self._kv_per_token)
            new_keys = r.block_keys[req.matched_blocks :] if self.deployment.ems.enabled else ()
            self.stats.kv_transfer_bytes += nbytes
            self.stats.ems_stored_blocks += len(new_keys)
            plan = self._plan(
                kind=PlanKind.TRANSFER,
                instance=req.prefill,
                start_s=now_s,
                requests=(rid,),
                block_keys=new_keys,
                transfer=KvTransfer(
                    src=req.prefill,
                    dst=target,
                    bytes=nbytes,
                    src_npu=self._first_npu(self._prefills[req.prefill].lost),
                    dst_npu=self._first_npu(inst.lost),
                ),
            )
            self._steps[plan.id] = _Step(plan)
            plans.append(plan)
        return plans

    def _start_decode(self, inst: _Decode, now_s: float) -> StepPlan:
        for slot in inst.joining:
            inst.active[slot] = True
        inst.n_active += len(inst.joining)
        inst.joining = []
        slots = np.flatnonzero(inst.active)
        per_die = np.bincount(slots % inst.dies, minlength=inst.dies)
        batch = int(per_die.max())
        kv = float((inst.context[slots] + inst.emitted[slots]).mean())
        s = self.stats
        s.decode_steps += 1
        s.batch_per_die_sum += batch
        s.batch_per_die_max = max(s.batch_per_die_max, batch)
        s.batch_histogram[batch] = s.batch_histogram.get(batch, 0) + 1
        micro = self.deployment.decode.microbatches
        dies, ep = inst.alive, inst.ep
        plan = self._plan(
            kind=PlanKind.DECODE,
            instance=inst.name,
            start_s=now_s,
            requests=tuple(inst.ids[i] for i in slots.tolist()) if self.stream_tokens else (),
            moe=MoeShape(
                ranks=ep,
                tokens_per_rank=cost.decode_tokens_per_rank(
                    batch_per_die=batch,
                    mtp=self.deployment.decode.mtp,
                    microbatches=micro,
                    dies=dies,
                    ep=ep,
                    model=self.model,
                ),
                layers=self.model.moe_layers,
                microbatches=micro,
                lost=tuple(sorted(inst.lost)),
            ),
            batch_per_die=batch,
        )
        step = _Step(plan, batch=batch, kv=kv, dies=dies, ep=ep, imbalance=inst.imbalance)
        self._steps[plan.id] = step
        inst.busy = plan.id
        return plan
