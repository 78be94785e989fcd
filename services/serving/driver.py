"""The live driver: the serving engine run on the emulated clock against the real services.

The engine (emulator/model/serving/engine.py) decides everything and hands out step plans; this
driver performs each plan against the live supernode and reports what it measured:
- LOOKUP: EMS MatchPrefix of the prompt's tokens (the hit count is EMS's; the lookup's cost is
  the calibration's, as MatchPrefix moves no data);
- PREFILL, DECODE: one MoE dispatch and one combine of the plan's shape through the fabric's
  Collective over the instance's dies (the engine multiplies by layers and microbatches);
- TRANSFER: the KV cache as one size-only UB write from a prefill NPU into the decode NPU's KV
  region, timed by the fabric; the prompt's new blocks are stored in EMS off the critical path.

Emulated time is virtual here as in the simulator: the engine advances to each due instant
exactly (never to "whenever the loop woke up"), only once the wall clock has reached it and every
outstanding plan is reported. So the token times are the engine's to the nanosecond whatever the
loop's latency, and the live run agrees with the discrete-event simulation; the wall clock only
decides when events are released (never before their emulated time).

The data path (issue 20): the collectives are over the instance's dies, so the fabric's view of
its ranks decides the step: a dead member (crash, die-down, node power-off) fails the step at once
(UNAVAILABLE), a hung one holds it past the step deadline, and a slowed one's compute share comes
back with the collectives and costs the step's kernels at its pace (TTFT and TPOT follow).

Faults (issue 11). A measurement that fails (UNAVAILABLE from the fabric or a device) or takes
longer than the step deadline is reported to the engine as a failed step, costing `step_retry_s`
of emulated time: its requests are retried or, past their retries, finish with an error the
client sees; the instance's NPUs are then probed (services/serving/recovery.py) and one that does
not answer is isolated. `isolate` and `restore` take NPUs out of an instance and bring them (or
their replacements) back, at an emulated instant, as inputs to the engine like any submit; every
request the driver accepted ends in a finish (length, cancelled or error): one the engine lost
would be counted `dropped` and failed visibly, never left hanging.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc
import structlog

from cmemu.v1 import ems_pb2, ems_pb2_grpc
from emulator.engines.clock import Timeline
from emulator.engines.events import EventSink
from emulator.engines.peers import CollectiveOutcome
from emulator.model.collectivespec import CollectiveSpec
from emulator.model.ems import prefix_keys
from emulator.model.errors import EmulatorError, InvalidArgumentError, UnavailableError
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.serving.deployment import instance_dies
from emulator.model.serving.engine import (
    Engine,
    Event,
    FinishEvent,
    FinishReason,
    PlanKind,
    Request,
    RetryEvent,
    StepPlan,
    StepResult,
    TokenEvent,
    rank_dies,
)
from emulator.model.serving.models import get_model
from emulator.model.topology import Device
from emulator.model.ub import Op, Transaction
from services.gateway_kv import KvOverRdma
from services.peers import Peers
from services.serving.stats import RequestMetrics, ServingStats

log = structlog.get_logger("cmemu.router")

RETRY_WALL_S = 0.5  # a round that raised (a bug, not a fault) is tried again after this
KV_BLOCK_KIND = ems_pb2.OBJECT_KIND_KV_BLOCK


@dataclass(frozen=True, kw_only=True)
class LiveInstance:
    """An engine instance on real hardware: its NPUs and their dies in layout order, and where
    KV caches arriving on each NPU go (a region of its HBM)."""

    id: str
    npus: tuple[Device, ...]
    dies: tuple[str, ...]
    kv_offsets: tuple[int, ...] = ()  # per NPU: the KV region's offset (decode instances)


@dataclass(frozen=True, kw_only=True)
class ServingModel:
    """What the driver needs of the model: block size and KV bytes per token."""

    block_tokens: int
    kv_bytes_per_token: int
    lookup_s: float


@dataclass(eq=False)
class Stream:
    """One request as its caller sees it: the engine's events for it, in order."""

    request: Request
    tokens: tuple[int, ...]
    metrics: RequestMetrics
    events: asyncio.Queue[TokenEvent | FinishEvent] = field(default_factory=asyncio.Queue)
    finished: FinishEvent | None = None
    accepted: bool = False  # the engine took it (its submit was applied)

    async def __aiter__(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        while True:
            event = await self.events.get()
            yield event
            if isinstance(event, FinishEvent):
                return


@dataclass(frozen=True, kw_only=True)
class Health:
    """What GetDeployment reports of the deployment's faults."""

    failed_dies: tuple[str, ...]
    last_isolated_ns: int
    last_restored_ns: int
    health: str  # "serving" | "degraded" | "recovering"


Prober = Callable[[str, StepPlan, str, str], Awaitable[None]]
"""(deployment, the failed plan, the error, the dead rank the fabric named or "")."""


@dataclass(frozen=True)
class _Input:
    """Something from outside to hand the engine at its emulated instant."""

    time_s: float
    apply: Callable[[float], None]


class Driver:
    """Owns one deployment's engine; `run` is its loop (a task of the router's TaskGroup)."""

    def __init__(
        self,
        *,
        name: str,
        engine: Engine,
        instances: Sequence[LiveInstance],
        model: ServingModel,
        clock: Timeline,
        peers: Peers,
        ems_address: str,
        events: EventSink | None,
        profile: HardwareProfile = DEFAULT_PROFILE,
    ) -> None:
        self.name = name
        self.profile = profile
        self.engine = engine
        self.instances = {i.id: i for i in instances}
        self.model = model
        self.clock = clock
        self.peers = peers
        self.events = events
        self.ems = ems_pb2_grpc.EmsStub(peers.channel(ems_address))
        self.kv_rdma = KvOverRdma.of(peers)  # prefill -> decode over RDMA, when there is a plane
        self.stats = ServingStats()
        self.streams: dict[str, Stream] = {}
        self._inputs: deque[_Input] = deque()
        self._outstanding: set[int] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._engine_s = 0.0  # the engine's time: the last instant it was advanced to
        self._ids = itertools.count()
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._measuring: dict[int, tuple[StepPlan, asyncio.Task[None]]] = {}
        self._open = 0  # accepted requests not finished: the engine's in_flight, or one is lost
        self.isolated: dict[str, tuple[str, tuple[int, ...]]] = {}  # npu: (instance, die indexes)
        self.recovering: set[str] = set()  # npus whose replacement is loading
        self.last_isolated_ns = 0
        self.last_restored_ns = 0
        self.prober: Prober | None = None  # set by the recovery watcher

    # --- the outside: submit and cancel -------------------------------------------------------

    def now_s(self) -> float:
        return self.clock.now_ns() / 1e9

    def engine_now_s(self) -> float:
        """The present emulated instant, never before the engine's own time."""
        return max(self.now_s(), self._engine_s)

    def submit(self, tokens: Sequence[int], max_tokens: int) -> Stream:
        """Hand a request to the engine at the present emulated instant."""
        if self._closing:
            raise UnavailableError(f"deployment {self.name!r} is stopping", subject=self.name)
        if not tokens:
            raise InvalidArgumentError("the prompt is empty", field="prompt")
        if max_tokens < 1:
            raise InvalidArgumentError("max_tokens must be >= 1", field="max_tokens")
        context = get_model(self.engine.deployment.model).context_tokens
        if len(tokens) + max_tokens > context:  # issue 21: an int64 the engine cannot hold
            raise InvalidArgumentError(
                f"{len(tokens)} prompt and {max_tokens} output tokens exceed the model's "
                f"context of {context}",
                field="max_tokens",
            )
        arrival = max(self.now_s(), self._engine_s)
        request_id = f"{self.name}-{next(self._ids)}"
        keys = prefix_keys(tokens, self.model.block_tokens, self.name)
        request = Request(
            id=request_id,
            arrival_s=arrival,
            input_tokens=len(tokens),
            output_tokens=max_tokens,
            block_keys=tuple(keys),
        )
        stream = Stream(
            request=request,
            tokens=tuple(tokens),
            metrics=RequestMetrics(
                request_id=request_id, arrival_ns=round(arrival * 1e9), prompt_tokens=len(tokens)
            ),
        )
        if not self.engine.accepting():
            raise UnavailableError(
                f"deployment {self.name!r} has no prefill instance in service (a lost die is "
                "being replaced)",
                subject=self.name,
                retry_after_s=self.profile.serving.step_retry_s,
            )
        self.streams[request_id] = stream
        self.stats.in_flight += 1
        self._push(_Input(arrival, lambda at: self._submit_now(stream, at)))
        return stream

    def _submit_now(self, stream: Stream, at_s: float) -> None:
        self.engine.submit(stream.request, at_s)
        stream.accepted = True
        self._open += 1

    def cancel(self, request_id: str) -> None:
        """Drop a request (a client that went away): the engine frees its KV."""
        if request_id in self.streams and not self._closing:
            at = max(self.now_s(), self._engine_s)
            self._push(_Input(at, lambda t: self._cancel_now(request_id, t)))

    def _cancel_now(self, request_id: str, at_s: float) -> None:
        self.engine.cancel(request_id, at_s)  # False: it finished meanwhile, nothing to free

    def _push(self, item: _Input) -> None:
        self._inputs.append(item)
        self._wake.set()

    # --- faults: isolate and restore ------------------------------------------------------------

    def locate(self, npu: str) -> tuple[str, int] | None:
        """The instance holding `npu` and its index among the instance's NPUs."""
        for inst in self.instances.values():
            for k, device in enumerate(inst.npus):
                if device.id == npu:
                    return inst.id, k
        return None

    def isolate(self, npus: Sequence[str], cause: str, job: Callable[[str], str]) -> list[str]:
        """Take `npus` (those of this deployment not isolated yet) out of their instances now:
        the engine drops their dies at the present emulated instant. The NPUs taken."""
        per = self.profile.npu.dies
        taken: list[str] = []
        for npu in npus:
            where = self.locate(npu)
            if where is None or npu in self.isolated:
                continue
            instance, k = where
            dies = tuple(range(k * per, (k + 1) * per))
            self.isolated[npu] = (instance, dies)
            taken.append(npu)
            self._preempt(instance, f"{npu} was isolated ({cause})")
            at = self._input_at(self.now_s())

            def apply(
                t: float, npu: str = npu, instance: str = instance, d: tuple[int, ...] = dies
            ) -> None:
                self.engine.isolate(instance, d, t)
                t_ns = round(t * 1e9)
                self.last_isolated_ns = t_ns
                self.publish(
                    "isolated",
                    t_ns,
                    instance=instance,
                    job=job(instance),
                    npus=[npu],
                    dies=[self.instances[instance].dies[i] for i in d],
                    cause=cause,
                )

            self._push(_Input(at, apply))
        return taken

    def restore(
        self, old: str, new: Device, kv_offset: int | None, at_s: float, job: Callable[[str], str]
    ) -> None:
        """Bring isolated NPU `old` back as `new` (itself or its replacement, its weights
        loaded) at emulated `at_s` (no earlier than inputs already queued)."""
        found = self.isolated.get(old)
        if found is None:
            return
        instance, dies = found
        at = self._input_at(at_s)

        def apply(t: float) -> None:
            inst = self.instances[instance]
            ids = [d.id for d in inst.npus]
            if old not in ids:  # restored already
                return
            k = ids.index(old)
            npus = list(inst.npus)
            npus[k] = new
            offsets = list(inst.kv_offsets)
            if offsets and kv_offset is not None:
                offsets[k] = kv_offset
            per = self.profile.npu.dies
            names = list(inst.dies)
            names[k * per : (k + 1) * per] = instance_dies([new.id], self.profile)
            self.instances[instance] = LiveInstance(
                id=instance, npus=tuple(npus), dies=tuple(names), kv_offsets=tuple(offsets)
            )
            self.engine.restore(instance, dies, t)
            self.isolated.pop(old, None)
            self.recovering.discard(old)
            t_ns = round(t * 1e9)
            self.last_restored_ns = t_ns
            self.publish(
                "restored",
                t_ns,
                instance=instance,
                job=job(instance),
                npus=[new.id],
                replaced=old if old != new.id else "",
            )

        self._push(_Input(at, apply))

    def _input_at(self, t_s: float) -> float:
        """An input's instant: no earlier than the engine's time or the inputs queued (the
        engine takes them in order)."""
        at = max(t_s, self._engine_s)
        return max(at, self._inputs[-1].time_s) if self._inputs else at

    def health(self) -> Health:
        out = self.engine.isolated()  # what is applied, not what is queued
        failed = [self.instances[inst].dies[i] for inst, dies in out.items() for i in dies]
        state = "serving"
        if out and self.recovering:
            state = "recovering"
        elif out or not self.engine.accepting():
            state = "degraded"
        return Health(
            failed_dies=tuple(sorted(failed)),
            last_isolated_ns=self.last_isolated_ns,
            last_restored_ns=self.last_restored_ns,
            health=state,
        )

    def publish(self, event: str, t_ns: int, **detail: object) -> None:
        if self.events is not None:
            self.events.event("router", event, t_ns, deployment=self.name, **detail)

    # --- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Advance the engine at each due instant until close(); a failed round is logged and
        the loop goes on."""
        while not self._closing:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("serving round failed", deployment=self.name)
                await asyncio.sleep(RETRY_WALL_S)

    async def _wait(self, until_ns: int | None) -> None:
        """Until something wakes the loop, or emulated time reaches `until_ns`."""
        await self.clock.wait(self._wake, until_ns)
        self._wake.clear()

    async def _round(self) -> None:
        if self._outstanding:  # the engine cannot move until every plan is measured
            await self._wait(None)
            return
        due = self.engine.next_due_time()
        first_input = self._inputs[0].time_s if self._inputs else None
        candidates = [t for t in (due, first_input) if t is not None]
        if not candidates:
            await self._wait(None)
            return
        at = max(min(candidates), self._engine_s)
        if self.clock.now_s() < at:
            await self._wait(round(at * 1e9))
            return
        while self._inputs and self._inputs[0].time_s <= at:
            self._apply(self._inputs.popleft(), at)
        advance = self.engine.advance(at)
        self._engine_s = at
        load = self.engine.decode_load().values()
        self.stats.kv_slots_held = sum(held for held, _ in load)
        self.stats.kv_slots = sum(capacity for _, capacity in load)
        for event in advance.events:
            self._deliver(event)
        if self._open != self.engine.in_flight:
            self._drop_lost(at)
        for plan in advance.plans:
            self._outstanding.add(plan.id)
            task = self._spawn(self._measure(plan), f"plan-{plan.id}")
            self._measuring[plan.id] = (plan, task)

    def _apply(self, item: _Input, at: float) -> None:
        """Hand one input to the engine; one it refuses ends that request (with an error its
        client sees), not the loop."""
        try:
            item.apply(at)
        except EmulatorError as exc:
            log.warning("the engine refused an input", deployment=self.name, error=str(exc))
            if exc.subject in self.streams:
                self._fail_stream(self.streams[exc.subject], at, str(exc))

    def _fail_stream(self, stream: Stream, at: float, error: str) -> None:
        self._deliver(
            FinishEvent(
                request_id=stream.request.id,
                time_s=at,
                reason=FinishReason.ERROR,
                tokens=stream.metrics.completion_tokens,
                error=error,
            )
        )

    def _drop_lost(self, at: float) -> None:
        """Requests the driver accepted that the engine no longer knows, without a finish: a
        bug, never silent: each is counted dropped and fails with an error its client sees."""
        for stream in list(self.streams.values()):
            if stream.accepted and not self.engine.knows(stream.request.id):
                log.error("a request was lost", deployment=self.name, request=stream.request.id)
                self.stats.dropped += 1
                self._fail_stream(stream, at, "the request was lost by the engine")

    def _spawn(self, work: object, name: str) -> asyncio.Task[None]:
        assert asyncio.iscoroutine(work)
        task = asyncio.get_running_loop().create_task(work, name=f"{self.name}-{name}")
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    # --- events out ----------------------------------------------------------------------------

    def _deliver(self, event: Event) -> None:
        stream = self.streams.get(event.request_id)
        if stream is None:
            return
        m = stream.metrics
        t_ns = round(event.time_s * 1e9)
        if isinstance(event, RetryEvent):  # the client sees nothing: its tokens continue
            if m.retries == 0:
                self.stats.retried += 1
            m.retries += 1
            return
        if isinstance(event, TokenEvent):
            if m.first_token_ns is None:
                m.first_token_ns = t_ns
            m.last_token_ns = t_ns
            m.completion_tokens = event.index + event.count
        else:
            stream.finished = event
            m.cancelled = event.reason is FinishReason.CANCELLED
            m.failed = event.reason is FinishReason.ERROR
            m.error = event.error
            m.completion_tokens = event.tokens
            self.streams.pop(event.request_id, None)
            self.stats.in_flight -= 1
            if stream.accepted:
                self._open -= 1
            self.stats.record(m)
            if self.events is not None:
                self.events.event("router", "request", t_ns, deployment=self.name, **m.detail())
        stream.events.put_nowait(event)

    # --- measuring plans -----------------------------------------------------------------------

    def deadline_wall_s(self) -> float:
        s = self.profile.serving
        return max(s.step_deadline_min_wall_s, self.clock.clock.wall_delay_s(s.step_deadline_s))

    async def _measure(self, plan: StepPlan) -> None:
        measure = MEASURES[plan.kind]
        try:
            async with asyncio.timeout(self.deadline_wall_s()):
                result = await measure(self, plan)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a fault cut a route, a die stopped answering, ...
            error = str(exc) or f"no answer within {self.profile.serving.step_deadline_s} s"
            log.warning(
                "step failed",
                deployment=self.name,
                plan=plan.kind.value,
                instance=plan.instance,
                error=error,
            )
            self.engine.fail(plan.id, plan.start_s + self.profile.serving.step_retry_s, error)
            dead = ""  # a collective's dead rank, as the fabric names it (a down die too)
            if isinstance(exc, EmulatorError) and exc.reason == "PEER_UNREACHABLE":
                dead = exc.subject or ""
            if self.prober is not None and plan.kind is not PlanKind.LOOKUP:
                self._spawn(self.prober(self.name, plan, error, dead), f"probe-{plan.id}")
        else:
            self.engine.report(plan.id, result)
        self._measured(plan.id)

    def _measured(self, plan_id: int) -> None:
        self._measuring.pop(plan_id, None)
        self._outstanding.discard(plan_id)
        self._wake.set()

    def _preempt(self, instance: str, why: str) -> None:
        """Stop waiting for measurements on `instance` (a hung die never answers): each is a
        failed step now, so that the isolation behind it applies at once."""
        for plan_id, (plan, task) in list(self._measuring.items()):
            t = plan.transfer
            if instance in (plan.instance, t.dst if t is not None else None):
                task.cancel()
                self.engine.fail(plan_id, plan.start_s + self.profile.serving.step_retry_s, why)
                self._measured(plan_id)

    async def _lookup(self, plan: StepPlan) -> StepResult:
        (request_id,) = plan.requests
        stream = self.streams.get(request_id)
        if stream is None:
            return StepResult(lookup_s=self.model.lookup_s)
        reply: ems_pb2.MatchPrefixResponse = await self.ems.MatchPrefix(
            ems_pb2.PrefixRequest(
                tokens=stream.tokens, block_tokens=self.model.block_tokens, namespace=self.name
            )
        )
        hit = min(reply.matched_tokens, len(stream.tokens))
        stream.metrics.prefix_hit_tokens = hit
        self.stats.lookup_tokens += len(stream.tokens)
        return StepResult(matched_blocks=reply.matched_blocks, lookup_s=self.model.lookup_s)

    async def _moe(self, plan: StepPlan) -> StepResult:
        if plan.kind is PlanKind.PREFILL:
            for request_id in plan.requests:
                stream = self.streams.get(request_id)
                if stream is not None and stream.metrics.prefill_start_ns is None:
                    stream.metrics.prefill_start_ns = round(plan.start_s * 1e9)
        shape = plan.moe
        if shape is None or shape.tokens_per_rank == 0:
            return StepResult()
        ranks = rank_dies(self.instances[plan.instance].dies, shape)
        fabric = self.peers.fabric()

        async def collective(op: str) -> CollectiveOutcome:
            spec = CollectiveSpec(op=op, tokens_per_rank=shape.tokens_per_rank)
            return await fabric.collective(ranks, spec)

        dispatch, combine = await asyncio.gather(
            collective("moe-dispatch"), collective("moe-combine")
        )
        return StepResult(
            dispatch_s=dispatch.duration_ns / 1e9,
            combine_s=combine.duration_ns / 1e9,
            compute_share=min(dispatch.compute_share, combine.compute_share),
        )

    def _pair(self, plan: StepPlan) -> tuple[Device, Device, int]:
        """The NPUs a request's KV cache moves between: each instance's first in service (where
        the simulator moves it too), and the offset of the receiving NPU's KV region."""
        t = plan.transfer
        assert t is not None
        src = self.instances[t.src]
        dst = self.instances[t.dst]
        return src.npus[t.src_npu], dst.npus[t.dst_npu], dst.kv_offsets[t.dst_npu]

    async def _transfer(self, plan: StepPlan) -> StepResult:
        assert plan.transfer is not None
        src, dst, offset = self._pair(plan)
        if plan.block_keys:
            self._spawn(self._store_blocks(plan.block_keys, src.id), f"store-{plan.id}")
        if plan.transfer.bytes == 0:
            return StepResult()
        if self.kv_rdma is not None:
            took_s = await self.kv_rdma.write(src, dst, offset, plan.transfer.bytes)
            return StepResult(transfer_s=took_s)
        tx = Transaction(
            op=Op.WRITE, dst_eid=dst.eid, dst_offset=offset, size=plan.transfer.bytes,
            size_only=True,
        )  # fmt: skip
        done = await self.peers.device(src).submit(tx, deadline_s=None)
        return StepResult(transfer_s=(done.complete_ns - done.issue_ns) / 1e9)

    async def _store_blocks(self, keys: Sequence[str], device: str) -> None:
        """The prompt's new KV blocks into EMS, from the prefill NPU (not on the critical path:
        a failure costs only future hits)."""
        size = self.model.block_tokens * self.model.kv_bytes_per_token
        items = [
            ems_pb2.PutRequest(key=k, size=size, kind=KV_BLOCK_KIND, device=device) for k in keys
        ]
        try:
            await self.ems.BatchPut(ems_pb2.BatchPutRequest(items=items))
        except grpc.aio.AioRpcError as exc:
            log.warning("storing KV blocks failed", deployment=self.name, error=exc.details())

    # --- the end -------------------------------------------------------------------------------

    async def close(self) -> None:
        """End the loop; requests still in flight finish CANCELLED for their callers."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        for task in list(self._side_tasks):
            task.cancel()
        await asyncio.gather(*self._side_tasks, return_exceptions=True)
        at_s = self._engine_s
        for stream in list(self.streams.values()):
            self._deliver(
                FinishEvent(
                    request_id=stream.request.id,
                    time_s=at_s,
                    reason=FinishReason.CANCELLED,
                    tokens=stream.metrics.completion_tokens,
                )
            )

    def pairs(self, plan: StepPlan) -> list[Device]:
        """The NPUs a failed plan ran on (what to probe)."""
        if plan.transfer is not None:
            src, dst, _ = self._pair(plan)
            return [src, dst]
        return list(self.instances[plan.instance].npus)


MEASURES = {
    PlanKind.LOOKUP: Driver._lookup,
    PlanKind.PREFILL: Driver._moe,
    PlanKind.DECODE: Driver._moe,
    PlanKind.TRANSFER: Driver._transfer,
}
