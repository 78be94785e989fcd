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
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.serving import cost
from emulator.model.serving.deployment import Deployment
from emulator.model.serving.experts import imbalance
from emulator.model.serving.models import get_model
from emulator.model.serving.router import ROUTERS, Load, RouterState


class PlanKind(StrEnum):
    LOOKUP = "lookup"
    PREFILL = "prefill"
    TRANSFER = "transfer"
    DECODE = "decode"


class FinishReason(StrEnum):
    LENGTH = "length"  # every output token emitted
    CANCELLED = "cancelled"


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
    over `ranks` dies (the instance's first `ranks` dies, in the deployment's layout order), each
    rank sending `tokens_per_rank` tokens (per microbatch: with two microbatches each collective
    carries half the tokens and runs twice per layer)."""

    ranks: int
    tokens_per_rank: int
    layers: int
    microbatches: int


@dataclass(frozen=True, kw_only=True)
class KvTransfer:
    src: str  # prefill instance id
    dst: str  # decode instance id
    bytes: int


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


Event = TokenEvent | FinishEvent


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


IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
_INF = float("inf")


class _Decode:
    """A decode instance's slots: max_batch_per_die x dies, slot i on die i % dies. Per-request
    counters live in arrays so that a step over 15,000 requests is a few vector operations."""

    def __init__(self, name: str, dies: int, per_die: int) -> None:
        self.name = name
        self.dies = dies
        n = dies * per_die
        self.ids: list[str] = [""] * n
        self.active = np.zeros(n, dtype=bool)  # in the batch
        self.emitted = np.zeros(n, dtype=np.int64)
        self.target = np.zeros(n, dtype=np.int64)
        self.context = np.zeros(n, dtype=np.int64)  # prompt tokens
        self.credit = np.zeros(n, dtype=np.float64)
        self.per_die = np.zeros(dies, dtype=np.int64)
        # lowest level first, so that filling keeps the dies even
        self.free: list[int] = list(range(n))
        heapq.heapify(self.free)
        self.reserved = 0  # slots taken by transfers in flight or joined
        self.n_active = 0
        self.busy: int | None = None
        self.joining: list[int] = []

    @property
    def capacity(self) -> int:
        return len(self.ids)

    def take(self) -> int:
        slot = heapq.heappop(self.free)
        self.reserved += 1
        self.per_die[slot % self.dies] += 1
        return slot

    def release(self, slot: int) -> None:
        if self.active[slot]:
            self.n_active -= 1
        self.active[slot] = False
        self.ids[slot] = ""
        self.per_die[slot % self.dies] -= 1
        self.reserved -= 1
        heapq.heappush(self.free, slot)


@dataclass
class _Prefill:
    name: str
    queue: deque[str] = field(default_factory=deque)
    queued_tokens: int = 0
    busy: int | None = None


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
        self._decode_imbalance = imbalance(self.model, self._decode_ep, d.placement, profile)
        self._prefill_imbalance = imbalance(self.model, self._prefill_ep, d.placement, profile)
        self._tokens_per_step = profile.serving.mtp_tokens_per_step if d.decode.mtp else 1.0
        self._block = profile.serving.block_tokens
        self._kv_per_token = cost.kv_bytes_per_token(self.model, profile)
        self._decodes = {
            i: _Decode(i, self._decode_dies, d.decode.max_batch_per_die) for i in d.decode_ids()
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
        loads = [Load(instance=p.name, queued=p.queued_tokens) for p in self._prefills.values()]
        home = self._router.prefill(
            request.block_keys, loads, self.deployment.prefill.batch_tokens, self._route_state
        )
        self._reqs[request.id] = _Req(request=request, prefill=home)
        self._new.append(request.id)
        self.stats.submitted += 1

    def cancel(self, request_id: str, now_s: float) -> bool:
        """Drop a request wherever it is and free its KV; its FinishEvent (CANCELLED) comes from
        the next advance(). False when it is unknown or already finished."""
        req = self._reqs.pop(request_id, None)
        if req is None:
            return False
        emitted = 0
        if req.stage is _Stage.QUEUED:
            home = self._prefills[req.prefill]
            home.queue.remove(request_id)
            home.queued_tokens -= self._new_tokens(req)
        elif req.stage is _Stage.NEW:
            self._new.remove(request_id)
        elif req.stage is _Stage.WAITING:
            self._waiting.remove(request_id)
            emitted = 1
        elif req.stage in (_Stage.TRANSFER, _Stage.DECODE):
            inst = self._decodes[req.decode]
            emitted = int(inst.emitted[req.slot])
            if req.slot in inst.joining:
                inst.joining.remove(req.slot)
            inst.release(req.slot)
            self._slots_dirty = True
        # LOOKUP and PREFILL: the step in flight finds the request gone and skips it
        self.stats.cancelled += 1
        self._events.append(
            FinishEvent(
                request_id=request_id, time_s=now_s, reason=FinishReason.CANCELLED, tokens=emitted
            )
        )
        return True

    def report(self, plan_id: int, result: StepResult) -> None:
        """The caller's measurements for a plan: fixes the step's end time."""
        step = self._steps.get(plan_id)
        if step is None:
            raise NotFoundError(f"no plan {plan_id} in flight", subject=str(plan_id))
        if step.end_s is not None:
            raise PreconditionError(f"plan {plan_id} was reported already", subject=str(plan_id))
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
        step.end_s = step.plan.start_s + self._duration(step, result)
        heapq.heappush(self._due, (step.end_s, plan_id))

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
            self._complete(self._steps.pop(plan_id), end_s)
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
                imbalance=self._decode_imbalance,
                dies=self._decode_dies,
                ep=self._decode_ep,
                dispatch_s=result.dispatch_s,
                combine_s=result.combine_s,
                profile=self.profile,
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
        return req.request.input_tokens - req.matched_blocks * self._block

    def _enqueue(self, req: _Req) -> None:
        req.stage = _Stage.QUEUED
        home = self._prefills[req.prefill]
        home.queue.append(req.request.id)
        home.queued_tokens += self._new_tokens(req)
        self._dirty_prefill.add(home.name)

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
        self._enqueue(req)

    def _prefilled(self, step: _Step, end_s: float) -> None:
        self._prefills[step.plan.instance].busy = None
        self._dirty_prefill.add(step.plan.instance)
        for rid in step.plan.requests:
            req = self._reqs.get(rid)
            if req is None:
                continue
            self._events.append(TokenEvent(request_id=rid, time_s=end_s, index=0, count=1))
            if req.request.output_tokens == 1:
                self._finish(rid, end_s, 1)
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
                self._enqueue(req)
        self._new = []
        # only instances whose state changed can start something (in instance order)
        if self._dirty_prefill:
            for inst in self._prefills.values():
                if inst.name in self._dirty_prefill and inst.busy is None and inst.queue:
                    plans.append(self._start_prefill(inst, now_s))
            self._dirty_prefill.clear()
        if self._waiting and self._slots_dirty:
            plans += self._start_transfers(now_s)
            self._slots_dirty = False
        if self._dirty_decode:
            for dec in self._decodes.values():
                startable = dec.busy is None and (dec.joining or dec.n_active)
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
            loads = [
                Load(instance=d.name, queued=d.reserved, free=d.capacity - d.reserved)
                for d in self._decodes.values()
            ]
            target = self._router.decode(loads, self._route_state)
            if target is None:
                break
            rid = self._waiting.popleft()
            req = self._reqs[rid]
            inst = self._decodes[target]
            slot = inst.take()
            r = req.request
            inst.ids[slot] = rid
            inst.emitted[slot] = 1
            inst.target[slot] = r.output_tokens
            inst.context[slot] = r.input_tokens
            inst.credit[slot] = 0.0
            req.stage, req.decode, req.slot = _Stage.TRANSFER, target, slot
            nbytes = int(r.input_tokens * self._kv_per_token)
            new_keys = r.block_keys[req.matched_blocks :] if self.deployment.ems.enabled else ()
            self.stats.kv_transfer_bytes += nbytes
            self.stats.ems_stored_blocks += len(new_keys)
            plan = self._plan(
                kind=PlanKind.TRANSFER,
                instance=req.prefill,
                start_s=now_s,
                requests=(rid,),
                block_keys=new_keys,
                transfer=KvTransfer(src=req.prefill, dst=target, bytes=nbytes),
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
        plan = self._plan(
            kind=PlanKind.DECODE,
            instance=inst.name,
            start_s=now_s,
            requests=tuple(inst.ids[i] for i in slots.tolist()) if self.stream_tokens else (),
            moe=MoeShape(
                ranks=self._decode_ep,
                tokens_per_rank=cost.decode_tokens_per_rank(
                    batch_per_die=batch,
                    mtp=self.deployment.decode.mtp,
                    microbatches=micro,
                    dies=self._decode_dies,
                    ep=self._decode_ep,
                    model=self.model,
                ),
                layers=self.model.moe_layers,
                microbatches=micro,
            ),
            batch_per_die=batch,
        )
        self._steps[plan.id] = _Step(plan, batch=batch, kv=kv)
        inst.busy = plan.id
        return plan
