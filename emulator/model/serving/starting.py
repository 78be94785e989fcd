"""Starting steps: prefix lookups for new requests, prefill batches from the queues, KV transfers
for prefilled requests into decode slots (where HBM allows), decode steps."""

from __future__ import annotations

import math

import numpy as np

from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.engine_state import EngineState
from cmemu.emulator.model.serving.hbm import GB
from cmemu.emulator.model.serving.instances import (
    NO_DECODE,
    DecodeInstance,
    PrefillInstance,
    Stage,
    Step,
)
from cmemu.emulator.model.serving.plans import (
    KvTransfer,
    MoeShape,
    PlanKind,
    StepPlan,
)
from cmemu.emulator.model.serving.router import Load


class Starting(EngineState):
    """What can start now, as plans for the caller to time."""

    def _start(self, now_s: float) -> list[StepPlan]:
        plans: list[StepPlan] = []
        lookups = self.deployment.ems.enabled
        for rid in self._new:
            req = self._reqs[rid]
            self.stats.prompt_tokens += req.request.input_tokens
            self.stats.prompt_blocks += len(req.request.block_keys)
            if lookups and req.request.block_keys:
                req.stage = Stage.LOOKUP
                plan = self._plan(
                    kind=PlanKind.LOOKUP,
                    instance=req.prefill,
                    start_s=now_s,
                    requests=(rid,),
                    block_keys=req.request.block_keys,
                )
                self._steps[plan.id] = Step(plan)
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

    def _start_prefill(self, inst: PrefillInstance, now_s: float) -> StepPlan:
        budget = self.deployment.prefill.batch_tokens
        batch: list[str] = []
        tokens = 0
        pairs = 0.0
        loaded = 0.0
        loads: list[float] = []
        while inst.queue:
            req = self._reqs[inst.queue[0]]
            new = self._new_tokens(req)
            if batch and tokens + new > budget:
                break
            inst.queue.popleft()
            inst.queued_tokens -= new
            req.stage = Stage.PREFILL
            batch.append(req.request.id)
            prefix = req.matched_blocks * self._block
            tokens += new
            pairs += new * (prefix + (new + 1) / 2)
            # the matched blocks its HBM does not hold come from EMS, each a read from the pool
            held = inst.cache.match(req.request.block_keys[: req.matched_blocks])
            from_ems = req.matched_blocks - held
            loaded += from_ems * self._block_bytes
            loads.append(
                cost.prefix_load_s(
                    from_ems,
                    self._block_bytes,
                    ub_across_servers=self._ub_across_servers,
                    profile=self.profile,
                )
            )
        s = self.stats
        s.prefill_batches += 1
        s.prefill_tokens += tokens
        s.ems_loaded_bytes += loaded
        s.prefill_requests[inst.name] = s.prefill_requests.get(inst.name, 0) + len(batch)
        s.prefill_hbm_hit_blocks += sum(self._reqs[r].matched_blocks for r in batch) - round(
            loaded / self._block_bytes
        )
        dies = self._prefill_dies
        # each request's blocks go to the dies holding its tokens, the dies read in parallel: the
        # batch waits for the longest single load or the loads spread over every die
        load_s = max(max(loads, default=0.0), sum(loads) / dies)
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
        self._steps[plan.id] = Step(
            plan, tokens=tokens, pairs=pairs, requests=len(batch), loaded=loaded, load_s=load_s
        )
        inst.busy_tokens = tokens
        inst.busy = plan.id
        return plan

    def _start_transfers(self, now_s: float) -> list[StepPlan]:
        plans: list[StepPlan] = []
        while self._waiting:
            req = self._reqs[self._waiting[0]]
            r = req.request
            final = need = self.memory.request_bytes(r.input_tokens + r.output_tokens)
            budget = self._kv_budget
            headroom = 0.0
            if self._on_demand and budget is not None:  # its context so far, and room to grow
                need = self.memory.request_bytes(r.input_tokens + req.resume + self._lookahead)
                headroom = budget * self.profile.serving.admission_watermark
            if budget is not None and final > budget:  # no die could ever hold it: an error
                self._waiting.popleft()
                self.stats.hbm_refused += 1
                self._fail(
                    req,
                    now_s,
                    f"its KV cache ({final / GB:.1f} GB for {r.input_tokens + r.output_tokens} "
                    f"tokens) exceeds a decode die's free HBM ({budget / GB:.1f} GB)",
                    req.resume + 1,
                )
                continue
            loads = [
                Load(
                    instance=d.name,
                    queued=d.reserved,
                    free=d.capacity - d.reserved
                    if d.fits(need, headroom) and not d.retiring
                    else 0,
                )
                for d in self._decodes.values()
            ]
            target = self._router.decode(loads, self._route_state)
            if target is None:
                if any(d.capacity > d.reserved and not d.retiring for d in self._decodes.values()):
                    self.stats.hbm_waits += 1
                break
            rid = self._waiting.popleft()
            inst = self._decodes[target]
            slot = inst.take(need, headroom)
            self.stats.kv_peak_bytes = max(self.stats.kv_peak_bytes, inst.kv_peak)
            inst.ids[slot] = rid
            inst.emitted[slot] = req.resume + 1
            inst.target[slot] = r.output_tokens
            inst.context[slot] = r.input_tokens
            inst.credit[slot] = 0.0
            req.stage, req.decode, req.slot = Stage.TRANSFER, target, slot
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
            self._steps[plan.id] = Step(plan)
            plans.append(plan)
        return plans

    def _start_decode(self, inst: DecodeInstance, now_s: float) -> StepPlan:
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
        step = Step(plan, batch=batch, kv=kv, dies=dies, ep=ep, imbalance=inst.imbalance)
        self._steps[plan.id] = step
        inst.busy = plan.id
        return plan
