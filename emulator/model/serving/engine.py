"""The serving engine: the one place where requests are scheduled.

A pure state machine. It decides everything a serving system decides (which prefill instance takes
a request, prefill batches, which decode instance continues it, continuous batching up to the cap
per die, cancellation) and computes every step's duration with the cost model, but it never does
I/O and never times communication itself. Instead it hands its caller *step plans* and the caller
reports back what it measured:

- LOOKUP: match a request's prompt blocks against the prefix cache (EMS MatchPrefix);
  report `matched_blocks` and `lookup_s`. A router that weighs what EMS holds
  (`Router.after_lookup`: kv-aware) chooses the request's prefill instance only then (the
  LOOKUP plan names the first instance in service). Matched
  blocks its prefill instance's HBM still holds (each keeps its prompts' blocks, LRU, up to
  `serving.prefill_prefix_bytes_per_die`) cost nothing; the others are read from the pool, one
  UB read per block (`cost.prefix_load_s`), pipelined layer by layer with the prefill.
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

from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    PreconditionError,
)
from cmemu.emulator.model.serving.completing import Completing
from cmemu.emulator.model.serving.faults import Faults
from cmemu.emulator.model.serving.instances import (
    Stage,
    Step,
    Tracked,
)
from cmemu.emulator.model.serving.plans import (
    Advance,
    EngineStats,
    Event,
    FinishEvent,
    FinishReason,
    KvTransfer,
    MoeShape,
    PlanKind,
    Request,
    RetryEvent,
    StepPlan,
    StepResult,
    TokenEvent,
    rank_dies,
)
from cmemu.emulator.model.serving.roles import Roles
from cmemu.emulator.model.serving.starting import Starting

__all__ = [
    "Advance",
    "Engine",
    "EngineStats",
    "Event",
    "FinishEvent",
    "FinishReason",
    "KvTransfer",
    "MoeShape",
    "PlanKind",
    "Request",
    "RetryEvent",
    "StepPlan",
    "StepResult",
    "TokenEvent",
    "rank_dies",
]

_INF = float("inf")


class Engine(Roles, Faults, Completing, Starting):
    """See the module docstring. Not thread-safe; one caller drives it.

    `stream_tokens=False` emits only each request's first token and its finish (what a report
    needs), not a TokenEvent per request per decode step: the simulator's fast path."""

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
        if self._router.after_lookup and self.deployment.ems.enabled and request.block_keys:
            # routed once the lookup has said what EMS holds: any instance in service for now
            home = next((p.name for p in self._prefills.values() if p.taking), None)
        else:
            home = self._route_prefill(request)
        self.stats.submitted += 1
        self.stats.context_tokens += request.input_tokens + request.output_tokens
        req = Tracked(request=request, prefill=home or "")
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

    def _drop(self, req: Tracked) -> int:
        """Take a request (already out of `_reqs`) out of wherever it waits or holds a slot;
        the output tokens it had emitted."""
        request_id = req.request.id
        emitted = req.resume
        if req.stage is Stage.QUEUED:
            home = self._prefills[req.prefill]
            home.queue.remove(request_id)
            home.queued_tokens -= self._new_tokens(req)
        elif req.stage is Stage.NEW:
            self._new.remove(request_id)
        elif req.stage is Stage.WAITING:
            self._waiting.remove(request_id)
            emitted = req.resume + 1
        elif req.stage in (Stage.TRANSFER, Stage.DECODE):
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

    def _unreported(self, plan_id: int) -> Step:
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

    def accepting(self) -> bool:
        """Whether a new request has a prefill and a decode instance to go to."""
        return self._unavailable() is None

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
