"""Ending steps: a step's duration from the caller's measurements and the cost model, and what
its end does to its requests (tokens, finishes, the next stage; or, reported failed, retries)."""

from __future__ import annotations

import math

import numpy as np

from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.engine_state import EngineState
from cmemu.emulator.model.serving.instances import (
    DecodeInstance,
    Stage,
    Step,
)
from cmemu.emulator.model.serving.plans import (
    PlanKind,
    StepResult,
    TokenEvent,
)


class Completing(EngineState):
    """Durations and step ends."""

    # --- durations ---------------------------------------------------------------------------

    def _duration(self, step: Step, result: StepResult) -> float:
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
            load_s=step.load_s,
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

    def _complete(self, step: Step, end_s: float) -> None:
        kind = step.plan.kind
        if kind is PlanKind.LOOKUP:
            self._looked_up(step, end_s)
        elif kind is PlanKind.PREFILL:
            self._prefilled(step, end_s)
        elif kind is PlanKind.TRANSFER:
            self._transferred(step)
        else:
            self._decoded(step, end_s)

    def _failed(self, step: Step, end_s: float) -> None:
        """A step reported failed ends: its requests retry where they were, or fail."""
        plan = step.plan
        why = f"{plan.kind.value} step on {plan.instance} failed: {step.failed}"
        if plan.kind is PlanKind.LOOKUP:  # the prefix cache is an optimisation: a miss
            step.matched = 0
            self._looked_up(step, end_s)
            return
        if plan.kind is PlanKind.PREFILL:
            inst = self._prefills[plan.instance]
            inst.busy, inst.busy_tokens = None, 0
            self._dirty_prefill.add(inst.name)
            again = []
            for rid in plan.requests:
                req = self._reqs.get(rid)
                if req is not None and self._retry(req, end_s, why):
                    again.append(req)
            for req in reversed(again):  # first in line again, in their order
                req.stage = Stage.QUEUED
                inst.queue.appendleft(req.request.id)
                inst.queued_tokens += self._new_tokens(req)
            return
        if plan.kind is PlanKind.TRANSFER:
            req = self._reqs.get(plan.requests[0])
            if req is None:
                return
            self._decodes[req.decode].release(req.slot)
            self._slots_dirty = True
            req.stage, req.decode, req.slot = Stage.WAITING, "", -1
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

    def _looked_up(self, step: Step, end_s: float) -> None:
        rid = step.plan.requests[0]
        req = self._reqs.get(rid)
        if req is None:
            return
        keys = len(req.request.block_keys)
        # at least one token is computed: the last block is recomputed when all of them hit
        most = min(keys, (req.request.input_tokens - 1) // self._block)
        req.matched_blocks = min(step.matched, most)
        self.stats.matched_blocks += req.matched_blocks
        if self._router.after_lookup:  # the router weighs what EMS holds too
            req.prefill = self._route_prefill(req.request, req.matched_blocks) or req.prefill
        self._enqueue(req, end_s)

    def _prefilled(self, step: Step, end_s: float) -> None:
        inst = self._prefills[step.plan.instance]
        inst.busy, inst.busy_tokens = None, 0
        self._dirty_prefill.add(inst.name)
        for rid in step.plan.requests:
            req = self._reqs.get(rid)
            if req is None:
                continue
            inst.cache.insert(req.request.block_keys)  # its prompt's KV is in this HBM now
            index = req.resume
            self._events.append(TokenEvent(request_id=rid, time_s=end_s, index=index, count=1))
            if req.request.output_tokens <= index + 1:
                self._finish(rid, end_s, index + 1)
                continue
            req.stage = Stage.WAITING
            self._waiting.append(rid)
            self._slots_dirty = True

    def _transferred(self, step: Step) -> None:
        rid = step.plan.requests[0]
        req = self._reqs.get(rid)
        if req is None:
            return
        req.stage = Stage.DECODE
        self._decodes[req.decode].joining.append(req.slot)
        self._dirty_decode.add(req.decode)

    def _decoded(self, step: Step, end_s: float) -> None:
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
        if self._on_demand and inst.kv_budget is not None:
            self._grow(inst)

    def _grow(self, inst: DecodeInstance) -> None:
        """On-demand admission: every request in the batch now holds its context so far and the
        next step's tokens; where a die's budget is exceeded its newest requests are preempted
        (recomputed: their KV dropped, prefilled again over their prompt and the tokens they had
        emitted, then decode on from there, as vLLM's recompute preemption does)."""
        active = inst.active
        context = (inst.context + inst.emitted + math.ceil(self._tokens_per_step)).astype(
            np.float64
        )
        need = np.where(active, self.memory.request_bytes(context), inst.need)
        for slot in inst.grow(need):
            rid = inst.ids[slot]
            req = self._reqs[rid]
            req.resume = int(inst.emitted[slot])
            self.stats.preemptions += 1
            self.stats.preempted_tokens += int(inst.context[slot]) + req.resume
            inst.release(slot)
            req.stage, req.decode, req.slot = Stage.NEW, "", -1
            self._new.append(rid)
            self._slots_dirty = True
        inst.kv_peak = max(inst.kv_peak, float(inst.kv_used.max(initial=0.0)))
        self.stats.kv_peak_bytes = max(self.stats.kv_peak_bytes, inst.kv_peak)
