"""The live driver: the serving engine run on the emulated clock against the real services.

The engine (emulator/model/serving/engine.py) decides everything and hands out step plans; this
driver has each plan performed against the live supernode (engines/serving/measures.py: EMS
lookups, MoE collectives through the fabric, KV transfers) and reports what it measured.

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
client sees; the instance's NPUs are then probed (engines/serving/recovery.py) and one that does
not answer is isolated. `isolate` and `restore` (engines/serving/isolation.py) take NPUs out of
an instance and bring them (or their replacements) back, at an emulated instant, as inputs to the
engine like any submit; every request the driver accepted ends in a finish (length, cancelled or
error; engines/serving/streams.py): one the engine lost would be counted `dropped` and failed
visibly, never left hanging.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.deadline import EmulatedDeadline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.gateway.kv import KvOverRdma
from cmemu.emulator.engines.serving.isolation import Isolation
from cmemu.emulator.engines.serving.measures import LiveInstance, Measures, ServingModel
from cmemu.emulator.engines.serving.peers import KvStore, ServingDirectory
from cmemu.emulator.engines.serving.stats import RequestMetrics
from cmemu.emulator.engines.serving.streams import Stream, Streams
from cmemu.emulator.model.ems import prefix_keys
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError, UnavailableError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.serving.engine import (
    Engine,
    PlanKind,
    Request,
    StepPlan,
)
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.topology import Device

log = structlog.get_logger("cmemu.router")

RETRY_WALL_S = 0.5  # a round that raised (a bug, not a fault) is tried again after this


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
        peers: ServingDirectory,
        ems: KvStore,
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
        self.ems = ems
        self.events = events
        self.requests = Streams(name=name, events=events)
        self.stats = self.requests.stats  # the router sums and exports them
        self.streams = self.requests.by_id
        self._inputs: deque[_Input] = deque()
        self._outstanding: set[int] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._engine_s = 0.0  # the engine's time: the last instant it was advanced to
        self._ids = itertools.count()
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._measuring: dict[int, tuple[StepPlan, asyncio.Task[None]]] = {}
        self.prober: Prober | None = None  # set by the recovery watcher
        self.isolation = Isolation(self)  # its NPUs out of service, and back
        # set by live dynamic PD (engines/serving/pdlive.py): it measures the arrivals, and
        # after each round sees which retiring instances have drained
        self.on_submit: Callable[[Request, float], None] | None = None
        self.on_round: Callable[[float], None] | None = None
        self.measures = Measures(
            name=name,
            model=model,
            instances=self.instances,
            streams=self.streams,
            stats=self.stats,
            ems=ems,
            peers=peers,
            kv_rdma=KvOverRdma.of(peers),  # prefill -> decode over RDMA, when there is a plane
            spawn=self._spawn,
        )

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
        self.requests.open += 1
        if self.on_submit is not None:
            self.on_submit(stream.request, at_s)

    def cancel(self, request_id: str) -> None:
        """Drop a request (a client that went away): the engine frees its KV."""
        if request_id in self.streams and not self._closing:
            at = max(self.now_s(), self._engine_s)
            self._push(_Input(at, lambda t: self._cancel_now(request_id, t)))

    def _cancel_now(self, request_id: str, at_s: float) -> None:
        self.engine.cancel(request_id, at_s)  # False: it finished meanwhile, nothing to free

    def at(self, t_s: float, apply: Callable[[float], None]) -> None:
        """Hand the engine `apply` at emulated `t_s` (no earlier than the inputs queued): it is
        called with the instant it is applied at."""
        self._push(_Input(self._input_at(t_s), apply))

    def _push(self, item: _Input) -> None:
        self._inputs.append(item)
        self._wake.set()

    def _input_at(self, t_s: float) -> float:
        """An input's instant: no earlier than the engine's time or the inputs queued (the
        engine takes them in order)."""
        at = max(t_s, self._engine_s)
        return max(at, self._inputs[-1].time_s) if self._inputs else at

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
            self.requests.deliver(event)
        if self.requests.open != self.engine.in_flight:
            self.requests.drop_lost(at, self.engine.knows)
        if self.on_round is not None:
            self.on_round(at)
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
                self.requests.fail(self.streams[exc.subject], at, str(exc))

    def _spawn(self, work: object, name: str) -> asyncio.Task[None]:
        assert asyncio.iscoroutine(work)
        task = asyncio.get_running_loop().create_task(work, name=f"{self.name}-{name}")
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    # --- measuring plans -----------------------------------------------------------------------

    def step_deadline(self) -> EmulatedDeadline:
        """A step's bound: its emulated seconds, so that a starved host (whose clock the
        governor slows) does not fail healthy steps; never below a loaded loop's stalls."""
        s = self.profile.serving
        return EmulatedDeadline(
            self.clock.clock, s.step_deadline_s, min_wall_s=s.step_deadline_min_wall_s
        )

    async def _measure(self, plan: StepPlan) -> None:
        try:
            async with self.step_deadline():
                result = await self.measures(plan)
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

    def preempt(self, instance: str, why: str) -> None:
        """Stop waiting for measurements on `instance` (a hung die never answers): each is a
        failed step now, so that the isolation behind it applies at once."""
        for plan_id, (plan, task) in list(self._measuring.items()):
            t = plan.transfer
            if instance in (plan.instance, t.dst if t is not None else None):
                task.cancel()
                self.engine.fail(plan_id, plan.start_s + self.profile.serving.step_retry_s, why)
                self._measured(plan_id)

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
        self.requests.cancel_all(self._engine_s)

    def pairs(self, plan: StepPlan) -> list[Device]:
        """The NPUs a failed plan ran on (what to probe)."""
        return self.measures.pairs(plan)
