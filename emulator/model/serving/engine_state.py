"""The engine's state and the helpers every part of it uses: routing a request to a prefill
queue, finishing, retrying and failing requests (emulator/model/serving/engine.py says what the
engine does; its parts are split by what they do: starting.py starts steps, completing.py ends
them, faults.py takes dies out and back)."""

from __future__ import annotations

import math
from collections import deque

from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving import cost
from cmemu.emulator.model.serving.deployment import PLATFORMS, Deployment
from cmemu.emulator.model.serving.experts import placement
from cmemu.emulator.model.serving.hbm import die_memory
from cmemu.emulator.model.serving.instances import (
    NO_DECODE,
    DecodeInstance,
    PrefillInstance,
    Stage,
    Step,
    Tracked,
)
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.plans import (
    EngineStats,
    Event,
    FinishEvent,
    FinishReason,
    Request,
    RetryEvent,
    StepPlan,
)
from cmemu.emulator.model.serving.prefix import PrefixCache
from cmemu.emulator.model.serving.router import ROUTERS, Ask, Load, RouterState, RouteWeights


class EngineState:
    """The state the engine's parts share, built from a deployment (see `Engine`)."""

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
        experts = self._decode_experts = placement(
            self.model, self._decode_ep, d.placement, profile
        )
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
        # on-demand admission (hbm.py): a request holds its context so far plus what the next
        # step adds, grown after every step; `reserve` holds its final context from the start
        self._on_demand = d.decode.admission == "on-demand"
        self._lookahead = math.ceil(self._tokens_per_step) + 1
        self._decodes = {
            i: DecodeInstance(
                i,
                self._decode_dies,
                d.decode.max_batch_per_die,
                experts,
                self._decode_imbalance,
                kv_budget=budget,
            )
            for i in d.decode_ids()
        }
        s = profile.serving
        self._block_bytes = self._kv_per_token * self._block
        self._prefix_blocks = int(
            self._prefill_dies * s.prefill_prefix_bytes_per_die // self._block_bytes
        )
        self._ub_across_servers = PLATFORMS[d.platform].ub_across_servers
        self._weights = RouteWeights(
            overlap=s.router_overlap_weight,
            shared_credit=cost.shared_block_credit(
                self.model,
                block_bytes=self._block_bytes,
                block_tokens=self._block,
                batch_tokens=d.prefill.batch_tokens,
                dies=self._prefill_dies,
                ep=self._prefill_ep,
                ub_across_servers=self._ub_across_servers,
                profile=profile,
            ),
            balance_abs_blocks=s.router_balance_abs_blocks,
            balance_rel=s.router_balance_rel,
            block_tokens=self._block,
            batch_tokens=d.prefill.batch_tokens,
        )
        self._prefills = {
            i: PrefillInstance(i, PrefixCache(self._prefix_blocks)) for i in d.prefill_ids()
        }
        self._reqs: dict[str, Tracked] = {}
        self._new: list[str] = []
        self._waiting: deque[str] = deque()
        self._steps: dict[int, Step] = {}
        self._due: list[tuple[float, int]] = []
        self._events: list[Event] = []
        self._next_plan = 0
        self._dirty_prefill: set[str] = set()  # may start a batch: queue grew or it went idle
        self._dirty_decode: set[str] = set()  # may start a step: someone joined or it went idle
        self._slots_dirty = False  # a decode slot was freed or a request began waiting

    def _new_tokens(self, req: Tracked) -> int:
        """Tokens a prefill computes: the prompt (and, after a lost KV cache, the output so far)
        beyond the matched prefix."""
        return req.request.input_tokens + req.resume - req.matched_blocks * self._block

    def _route_prefill(self, request: Request, shared: int = 0) -> str | None:
        """The prefill instance the router's policy picks, seeing each instance's prefill work
        (queued and in flight) and how much of the prompt its HBM holds."""
        keys = request.block_keys
        peek = self._router.after_lookup and keys  # only a router weighing caches looks
        loads = [
            Load(
                instance=p.name,
                queued=p.queued_tokens + p.busy_tokens,
                cached=p.cache.peek(keys) if peek else 0,
            )
            for p in self._prefills.values()
            if p.taking
        ]
        if not loads:
            return None
        ask = Ask(keys=keys, tokens=request.input_tokens, shared=shared)
        return self._router.prefill(ask, loads, self._weights, self._route_state)

    def _enqueue(self, req: Tracked, now_s: float) -> None:
        """Queue a request on its prefill instance (another one when that one lost a die; with
        none in service it fails)."""
        first = self._prefills.get(req.prefill)  # gone when it changed role meanwhile
        if first is None or not first.taking:
            home = self._route_prefill(req.request)
            if home is None:
                self._fail(req, now_s, "no prefill instance is in service")
                return
            req.prefill = home
        req.stage = Stage.QUEUED
        home_inst = self._prefills[req.prefill]
        home_inst.queue.append(req.request.id)
        home_inst.queued_tokens += self._new_tokens(req)
        self._dirty_prefill.add(home_inst.name)

    def _prefill_again(self, req: Tracked, now_s: float, reason: str) -> None:
        """A prefilled request whose KV cache was lost before it reached decode: its first token
        is out, so it is prefilled again from the one after."""
        req.resume += 1
        req.stage, req.decode, req.slot = Stage.NEW, "", -1
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

    def _retry(self, req: Tracked, now_s: float, reason: str, tokens: int | None = None) -> bool:
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

    def _fail(self, req: Tracked, now_s: float, reason: str, tokens: int | None = None) -> None:
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

    def _unavailable(self) -> str | None:
        """Why no request can be served now (None: it can)."""
        if not any(p.taking for p in self._prefills.values()):
            return "no prefill instance is in service (a lost die is replaced)"
        if not self._decoding():
            return NO_DECODE
        return None

    def _decoding(self) -> bool:
        return any(d.capacity > 0 and d.ep > 0 and not d.retiring for d in self._decodes.values())

    def _finish(self, rid: str, end_s: float, tokens: int) -> None:
        self._reqs.pop(rid, None)
        self.stats.finished += 1
        self._events.append(
            FinishEvent(request_id=rid, time_s=end_s, reason=FinishReason.LENGTH, tokens=tokens)
        )

    def _plan(self, **kwargs: object) -> StepPlan:
        plan = StepPlan(id=self._next_plan, **kwargs)  # type: ignore[arg-type]
        self._next_plan += 1
        return plan
