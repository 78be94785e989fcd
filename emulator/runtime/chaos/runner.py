"""Running a scenario against a running emulator: start its workloads, inject its faults on the
emulated schedule, watch the manager's incidents and the workloads' status, stop at the horizon
(or once everything has recovered), clean up, and judge.

Everything goes through gRPC (and the router's OpenAI endpoint for the background load), so any
launcher and any controller (the reference cluster manager or a user's own) can be judged.
Times are emulated: the runner sleeps on the wall clock only as long as time_scale says.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable

import grpc

from cmemu.v1 import fabric_pb2, manager_pb2
from emulator.client.clients import Clients
from emulator.client.clock import followed_time
from emulator.engines.clock import TimeKeeper, Timeline
from emulator.model.chaos.abort import crossed
from emulator.model.chaos.observed import IncidentRecord, Injection, Observations
from emulator.model.chaos.pace import Pace, PaceWindow
from emulator.model.chaos.recovery import recoveries
from emulator.model.chaos.scenario import Scenario
from emulator.model.chaos.schedule import Planned, horizon_s, plan
from emulator.model.chaos.selectors import Placement, devices_of, resolve
from emulator.model.chaos.timeline import Entry, build_timeline
from emulator.model.chaos.verdict import judge, steady_before
from emulator.model.errors import DeadlineExceededError, EmulatorError, PreconditionError
from emulator.model.hardware import DEFAULT_PROFILE
from emulator.model.topology import ServiceKind
from emulator.runtime.chaos import controlplane, kinds
from emulator.runtime.chaos.run import DEFAULTS, RunOptions, RunResult, stall_limit_s
from emulator.runtime.chaos.stall import stacks
from emulator.runtime.chaos.traffic import Traffic
from emulator.runtime.chaos.workloads import STATUS_WALL_S, Workloads
from services.rpc import status_line

DEFAULT_RECOVERY_S = 600.0  # observe this long after the last fault without recovered_within
SETTLE_S = 60.0  # emulated: after the last fault, wait at least this long before an early end
POLL_WALL_S = (0.02, 0.25)  # the status poll's period bounds, wall seconds
PLACEMENT_AHEAD_S = 1.0  # emulated: where the workloads run is asked this long before a fault
PACE_SETTLE_WALL_S = 10.0  # how long the fabric may take to apply a scenario's pace


class Runner:
    def __init__(
        self,
        clients: Clients,
        scenario: Scenario,
        options: RunOptions = DEFAULTS,
        *,
        on_entry: Callable[[Entry], None] | None = None,
    ) -> None:
        topology = clients.topology
        if topology.epoch_wall_s is None:
            raise PreconditionError("the topology has no epoch: is the emulator running?")
        self.clients = clients
        self.scenario = scenario
        self.options = options
        self.seed = scenario.seed if options.seed is None else options.seed
        self.keeper: TimeKeeper | None = None  # the emulator's time, followed while it runs
        self.pace_scale = options.time_scale or scenario.time_scale  # None: the emulator's
        self.workloads = Workloads(clients=clients, scenario=scenario)
        self.on_entry = on_entry
        self.has_manager = any(s.kind == ServiceKind.MANAGER for s in topology.services)
        workloads = scenario.workloads
        self.obs = Observations(
            start_ns=0,
            loaded=tuple(w.name for w in workloads.serving if w.load is not None),
            jobs=tuple(w.name for w in workloads.training),
        )
        self.traffic: list[Traffic] = []
        self._halt = asyncio.Event()  # an abort condition crossed (scenario `abort:`)
        self._printed: set[tuple[int, str, str]] = set()

    # --- the run -------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """The scenario, on the emulator's own emulated time (followed from its fabric)."""
        async with followed_time(
            self.clients.topology, self.clients.credentials, name="chaos-runner"
        ) as keeper:
            self.keeper = keeper
            limit = self.options.wall_limit_s
            if limit is None:
                horizon = horizon_s(self.scenario, plan(self.scenario, random.Random(self.seed)),
                                    DEFAULT_RECOVERY_S)  # fmt: skip
                limit = stall_limit_s(horizon, self._scale)
            run = asyncio.ensure_future(self._run())
            done, _ = await asyncio.wait({run}, timeout=limit)
            if run in done:
                return run.result()
            where = stacks(exclude=asyncio.current_task())  # before the cancel unwinds them
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run  # its clean-up: faults cleared, workloads stopped
            raise DeadlineExceededError(
                f"scenario {self.scenario.name!r} did not end within {limit:g} wall s "
                f"(time scale {keeper.timeline.time_scale:g}); it was waiting in:\n{where}",
                reason="CHAOS_RUN_STALLED",
            )

    @property
    def _clock(self) -> Timeline:
        assert self.keeper is not None, "the clock is followed while run() runs"
        return self.keeper.timeline

    async def _run(self) -> RunResult:
        wall0 = time.monotonic()
        window: PaceWindow | None = None
        rng = random.Random(self.seed)
        planned = plan(self.scenario, rng)
        horizon = horizon_s(self.scenario, planned, DEFAULT_RECOVERY_S)
        try:
            await self.workloads.start()
            placement = await self.workloads.placement()
            await self._pace_steps()
            window = await self._clock_now()  # the scenario's span, not the set-up's
            self.obs.start_ns = self._clock.now_ns()
            setup_wall_s = time.monotonic() - wall0
            await self.workloads.poll()  # the baseline: what was already reported is not news
            self._start_traffic()
            async with asyncio.TaskGroup() as tg:
                poller = tg.create_task(self._poll_loop(), name="chaos-poll")
                traffic = [tg.create_task(t.run(), name=f"chaos-load-{t.model}")
                           for t in self.traffic]  # fmt: skip
                await self._drive(planned, horizon, placement, rng)
                for t in self.traffic:
                    t.stop()
                await asyncio.gather(*traffic)
                poller.cancel()
            await self._poll_once()
            scenario_wall_s = time.monotonic() - wall0 - setup_wall_s
            await self._clear_control_plane()
            await self._finish()
        finally:
            await self._clear_all()
            if not self.options.keep:
                await self.workloads.stop()
        recs = recoveries(self.obs, self.scenario.expect.slo)
        verdict = judge(self.scenario.expect, self.obs, recs)
        pace = await self._pace(window)
        return RunResult(
            pace=pace,
            scenario=self.scenario,
            seed=self.seed,
            observations=self.obs,
            recoveries=recs,
            verdict=verdict,
            timeline=build_timeline(self.obs, recs),
            wall_s=time.monotonic() - wall0,
            setup_wall_s=setup_wall_s,
            scenario_wall_s=scenario_wall_s,
            time_scale=self._scale,
            notes=list(self.obs.notes),
        )

    @property
    def _scale(self) -> float:
        """The time scale the steps run at: the scenario's pace, at most the emulator's."""
        return min(self._clock.time_scale, self.pace_scale or math.inf)

    async def _pace_steps(self) -> None:
        """Hold emulated time to the scenario's pace from here on (the set-up ran at the
        emulator's own scale), and wait until the fabric applied it: the first fault and the
        first request must see that pace, not the set-up's."""
        if self.pace_scale is None or self.pace_scale >= self._clock.time_scale:
            return
        assert self.keeper is not None
        self.keeper.limit(self.pace_scale)
        settle = time.monotonic() + PACE_SETTLE_WALL_S
        while self._clock.clock.rate > self.pace_scale * (1 + 1e-9):
            if time.monotonic() > settle:
                self._note(
                    f"time scale {self.pace_scale:g} asked by the scenario was not applied "
                    f"within {PACE_SETTLE_WALL_S:g} s (rate {self._clock.clock.rate:g}): the "
                    "emulator's clock may not dilate (dilation off)"
                )
                return
            await asyncio.sleep(0.02)

    async def _clock_now(self) -> PaceWindow | None:
        try:
            info = await self.clients.fabric().GetClock(fabric_pb2.GetClockRequest(), timeout=10)
        except grpc.aio.AioRpcError as exc:
            self._note(f"the fabric's clock: {status_line(exc)}")
            return None
        return PaceWindow(
            start_emulated_s=info.emulated_ns / 1e9,
            start_wall_s=time.time(),
            start_worst_lag_emulated_s=info.worst_lag_emulated_s,
            start_silent=set(info.silent),
        )

    async def _pace(self, window: PaceWindow | None) -> Pace | None:
        """How this run kept pace, from the fabric's clock at its start and now."""
        if window is None:
            return None
        try:
            info = await self.clients.fabric().GetClock(fabric_pb2.GetClockRequest(), timeout=10)
        except grpc.aio.AioRpcError as exc:
            self._note(f"the fabric's clock: {status_line(exc)}")
            return None
        wall = max(time.time() - window.start_wall_s, 1e-9)
        stopped_by_us = {i.target for i in self.obs.injections if i.kind.startswith("process")}
        silent = set(info.silent) - window.start_silent - stopped_by_us
        return Pace(
            asked_scale=min(info.time_scale, self.pace_scale or math.inf),
            achieved_scale=(info.emulated_ns / 1e9 - window.start_emulated_s) / wall,
            dilation=info.dilation,
            longest_stall_s=info.longest_stall_s,
            worst_lag_emulated_s=info.worst_lag_emulated_s
            if info.worst_lag_emulated_s > window.start_worst_lag_emulated_s
            else 0.0,
            silent=tuple(sorted(silent)),
            lag_bound_s=DEFAULT_PROFILE.manager.heartbeat_interval_s,
        )

    def _start_traffic(self) -> None:
        loaded = [w for w in self.scenario.workloads.serving if w.load is not None]
        if not loaded:
            return
        http = self.clients.topology.service(ServiceKind.ROUTER).http_address
        for w in loaded:
            assert w.load is not None
            self.traffic.append(
                Traffic(url=f"http://{http}", model=w.name, load=w.load, clock=self._clock)
            )

    async def _sleep_until(self, emulated_s: float) -> bool:
        """Until `emulated_s` after the workloads were up; False when the run was halted."""
        until_ns = self.obs.start_ns + int(emulated_s * 1e9)
        return not await self._clock.wait(self._halt, until_ns)

    async def _drive(
        self, planned: list[Planned], horizon: float, placement: Placement, rng: random.Random
    ) -> None:
        """Inject and clear on schedule, then watch until the horizon or an early end."""
        actions: list[tuple[float, int, Planned]] = [(p.at_s, 1, p) for p in planned]
        actions += [(p.clear_at_s, 0, p) for p in planned if p.clear_at_s is not None]
        actions.sort(key=lambda a: (a[0], a[1]))
        live: dict[str, list[Injection]] = {}
        checked = False
        for at_s, inject, p in actions:
            if inject and p.step.target.group in ("deployment", "job"):
                # where the workloads run now (replacements moved them since the start), asked
                # before the instant so that the injection itself is on time
                if not await self._sleep_until(at_s - PLACEMENT_AHEAD_S):
                    break
                placement = await self._placement(placement)
            if not await self._sleep_until(at_s):
                break
            if inject and not checked:
                checked = True
                if not await self._steady_before():
                    return  # the hypothesis did not hold: nothing is put to the test
            if inject:
                live[p.label] = await self._inject(p, placement, rng)
                continue
            group = live.pop(p.label, [])
            if group and p.step.duration_s is not None:
                # a fault lasts its duration from when it went in, which may be after its plan
                went_in_s = (max(i.at_ns for i in group) - self.obs.start_ns) / 1e9
                if not await self._sleep_until(went_in_s + p.step.duration_s):
                    live[p.label] = group  # halted: cleared with the rest below
                    break
            await self._clear(group)
        if self._halt.is_set():  # the attack halts: what is in comes out now
            await self._clear([i for group in live.values() for i in group])
            return
        last = max((a[0] for a in actions), default=0.0)
        await self._watch(last, horizon)

    async def _placement(self, last: Placement) -> Placement:
        """Where the workloads run now; where they ran last when the service that says is down
        (a training job's placement is the manager's to tell: a scenario may have killed it)."""
        try:
            return await self.workloads.placement()
        except grpc.aio.AioRpcError as exc:
            self._note(f"where the workloads run: {status_line(exc)}; the last placement is used")
            return last

    async def _steady_before(self) -> bool:
        """The steady-state hypothesis, at the first fault's instant (before it goes in)."""
        if self.scenario.expect.steady_state is None:
            return True
        await self._poll_once()
        self.obs.steady_ns = self._clock.now_ns()
        if self.has_manager:
            try:
                listed = await self.clients.manager().ListIncidents(
                    manager_pb2.ListIncidentsRequest(since_ns=0), timeout=STATUS_WALL_S
                )
                aliases = self.workloads.aliases
                self.obs.open_before = [_incident(i, aliases) for i in listed.incidents]
            except grpc.aio.AioRpcError as exc:
                self._note(f"cluster manager: {status_line(exc)}")
        check = steady_before(self.scenario.expect, self.obs)
        if check is not None and not check.ok:
            self.obs.halted = check.detail
            self._note(f"nothing injected: {check.detail}")
            return False
        return True

    async def _inject(
        self, p: Planned, placement: Placement, rng: random.Random
    ) -> list[Injection]:
        step = p.step
        try:
            targets = resolve(step.target, self.clients.topology, placement, rng,
                              path=f"{step.path}.target")  # fmt: skip
        except EmulatorError as exc:
            targets, error = [step.target.literal or step.target.text], str(exc)
        else:
            error = ""
        at = self._clock.now_ns()

        async def one(target: str) -> Injection:
            fault_id, why = "", error
            if not why:
                try:
                    fault = await kinds.inject(
                        self.clients, step.fault, target, step.typed_params, step.duration_s
                    )
                    fault_id = fault.id
                except (EmulatorError, grpc.aio.AioRpcError) as exc:
                    why = status_line(exc)
            return Injection(
                label=p.label,
                kind=step.fault,
                target=target,
                devices=devices_of(step.target.what, target, self.clients.topology),
                at_ns=at,
                planned_ns=self.obs.start_ns + int(p.at_s * 1e9),
                fault_id=fault_id,
                error=why,
                tolerated=step.tolerated,
            )

        # every target of one step at once (a plane's switches): one instant of the schedule
        out = list(await asyncio.gather(*(one(t) for t in targets)))
        self.obs.injections += out
        self._emit()
        return out

    async def _clear(self, injections: list[Injection], *, record: bool = True) -> None:
        """Clear faults; `record`: the scenario cleared them (a clean-up at the end is not a
        clearance: a fault left until then lasted the whole run)."""
        for inj in injections:
            if not inj.fault_id:
                continue
            try:
                await kinds.clear(self.clients, inj.fault_id)
            except (EmulatorError, grpc.aio.AioRpcError) as exc:
                self.obs.notes.append(f"clearing {inj.fault_id}: {status_line(exc)}")
            if not record:
                continue
            cleared = Injection(**{**inj.__dict__, "cleared_ns": self._clock.now_ns()})
            index = self.obs.injections.index(inj)
            self.obs.injections[index] = cleared
        self._emit()

    async def _clear_all(self) -> None:
        pending = [i for i in self.obs.injections if i.fault_id and i.cleared_ns is None]
        await self._clear(pending, record=False)

    async def _clear_control_plane(self) -> None:
        """The services still down are brought back (not a clearance: the fault lasted the
        whole run) and answer before the workloads' records are read (controlplane.py)."""
        down = controlplane.still_down(self.obs.injections)
        if down:
            await self._clear(down, record=False)
            for note in await controlplane.answering(self.clients, [i.target for i in down]):
                self._note(note)

    async def _watch(self, last_s: float, horizon: float) -> None:
        """Until the horizon; or, past the last action and SETTLE_S, until all recovered."""
        step = self._clock.time_scale * POLL_WALL_S[1]
        t = last_s
        while t < horizon:
            t = min(horizon, t + step)
            if not await self._sleep_until(t):
                return
            if not self.options.early_end or t < last_s + SETTLE_S:
                continue
            if self._all_recovered() and await self._training_back():
                return

    async def _training_back(self) -> bool:
        try:
            return await self.workloads.training_back()
        except grpc.aio.AioRpcError as exc:
            self._note(f"training status: {status_line(exc)}")
            return False

    def _all_recovered(self) -> bool:
        self.obs.end_ns = self._clock.now_ns()
        recs = recoveries(self.obs, self.scenario.expect.slo)
        need_slo = self.scenario.expect.slo is not None
        return all(r.settled and (not need_slo or not r.affected or r.slo_back_ns) for r in recs)

    # --- observing -----------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        period = min(max(self._clock.clock.wall_delay_s(1.0), POLL_WALL_S[0]), POLL_WALL_S[1])
        while True:
            await self._poll_once()
            await asyncio.sleep(period)

    async def _poll_once(self) -> None:
        try:
            self.obs.events += await self.workloads.poll()
        except grpc.aio.AioRpcError as exc:
            self._note(f"workload status: {status_line(exc)}")
        if self.has_manager:
            try:
                listed = await self.clients.manager().ListIncidents(
                    manager_pb2.ListIncidentsRequest(since_ns=self.obs.start_ns),
                    timeout=STATUS_WALL_S,
                )
                aliases = self.workloads.aliases
                self.obs.incidents = [_incident(i, aliases) for i in listed.incidents]
            except grpc.aio.AioRpcError as exc:
                self._note(f"cluster manager: {status_line(exc)}")
        else:
            self._note("no cluster manager in this emulator: no incidents observed")
        self.obs.end_ns = self._clock.now_ns()
        self.obs.requests = [s for t in self.traffic for s in t.samples]
        self._emit()
        self._check_abort()

    def _check_abort(self) -> None:
        bounds = self.scenario.abort
        if bounds is None or self._halt.is_set():
            return
        why = crossed(bounds, self.obs)
        if why:
            self.obs.aborted, self.obs.aborted_ns = why, self._clock.now_ns()
            self._note(f"aborted: {why}")
            self._halt.set()

    def _note(self, note: str) -> None:
        if note not in self.obs.notes:
            self.obs.notes.append(note)

    async def _finish(self) -> None:
        self.obs.requests = [s for t in self.traffic for s in t.samples]
        if self.scenario.workloads.serving:
            self.obs.dropped_requests = await self.workloads.dropped_requests()
        if self.scenario.workloads.training:
            try:
                self.obs.training = await self.workloads.training_records()
            except grpc.aio.AioRpcError as exc:  # the manager that hosts them is down
                self._note(f"training records: {status_line(exc)}")
        ems = self.scenario.workloads.ems
        if ems is not None:
            self.obs.objects = ems.objects
            self.obs.lost_objects = await self.workloads.lost_objects()
        self.obs.end_ns = self._clock.now_ns()

    def _emit(self) -> None:
        """Hand the timeline's new entries to on_entry, as they happen."""
        if self.on_entry is None:
            return
        for entry in build_timeline(self.obs, []):
            key = (entry.at_ns, entry.phase, entry.subject)
            if key not in self._printed:
                self._printed.add(key)
                self.on_entry(entry)


def _incident(i: manager_pb2.Incident, aliases: dict[str, str]) -> IncidentRecord:
    """An incident, its jobs named as the scenario names its workloads."""
    return IncidentRecord(
        id=i.id,
        device=i.device,
        detected_by=i.detected_by,
        state=i.state,
        fault_ns=i.fault_ns,
        detected_ns=i.detected_ns,
        isolated_ns=i.isolated_ns,
        replaced_ns=i.replaced_ns,
        restored_ns=i.restored_ns,
        jobs=tuple(dict.fromkeys(aliases.get(j, j) for j in i.jobs)),
        replacements=tuple(i.replacements),
        detail=i.detail,
    )


async def run_scenario(
    clients: Clients,
    scenario: Scenario,
    options: RunOptions = DEFAULTS,
    *,
    on_entry: Callable[[Entry], None] | None = None,
) -> RunResult:
    return await Runner(clients, scenario, options, on_entry=on_entry).run()
