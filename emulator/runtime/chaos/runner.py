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

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.clock import clock_address, followed_time
from cmemu.emulator.client.fabric import FabricClient
from cmemu.emulator.engines.clock import TimeKeeper, Timeline
from cmemu.emulator.model.chaos.observed import Injection
from cmemu.emulator.model.chaos.pace import PaceWindow
from cmemu.emulator.model.chaos.recovery import recoveries
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.model.chaos.schedule import Planned, horizon_s, plan
from cmemu.emulator.model.chaos.selectors import Placement, devices_of, resolve
from cmemu.emulator.model.chaos.timeline import Entry, build_timeline
from cmemu.emulator.model.chaos.verdict import judge
from cmemu.emulator.model.errors import DeadlineExceededError, EmulatorError, PreconditionError
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.chaos import controlplane, kinds
from cmemu.emulator.runtime.chaos.observer import POLL_WALL_S, Observer
from cmemu.emulator.runtime.chaos.pacing import achieved_pace, hold_pace, pace_window
from cmemu.emulator.runtime.chaos.run import DEFAULTS, RunOptions, RunResult, stall_limit_s
from cmemu.emulator.runtime.chaos.stall import stacks
from cmemu.emulator.runtime.chaos.traffic import Traffic
from cmemu.emulator.runtime.chaos.workloads import Workloads
from cmemu.services.rpc import status_line

DEFAULT_RECOVERY_S = 600.0  # observe this long after the last fault without recovered_within
SETTLE_S = 60.0  # emulated: after the last fault, wait at least this long before an early end
PLACEMENT_AHEAD_S = 1.0  # emulated: where the workloads run is asked this long before a fault
AUTHORITY_WALL_S = 2.0  # a stamp's GetClock deadline: a fault's injection is never held up longer


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
        self.workloads = Workloads(clients=clients, scenario=scenario, warm=options.warm)
        self.observer = Observer(
            clients=clients,
            scenario=scenario,
            workloads=self.workloads,
            clock=lambda: self._clock,
            on_entry=on_entry,
        )
        self.obs = self.observer.obs  # what the run saw, filled as it goes

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
            assert self.keeper is not None
            await hold_pace(self.keeper, self.pace_scale, self.observer.note)
            # the scenario's span, not the set-up's
            window = await pace_window(self.clients, self.observer.note)
            self.obs.start_ns = self._clock.now_ns()
            setup_wall_s = time.monotonic() - wall0
            await self.workloads.poll()  # the baseline: what was already reported is not news
            self._start_traffic()
            async with asyncio.TaskGroup() as tg:
                poller = tg.create_task(self.observer.poll_loop(), name="chaos-poll")
                traffic = [tg.create_task(t.run(), name=f"chaos-load-{t.model}")
                           for t in self.observer.traffic]  # fmt: skip
                await self._drive(planned, horizon, placement, rng)
                for t in self.observer.traffic:
                    t.stop()
                await asyncio.gather(*traffic)
                poller.cancel()
            await self.observer.poll_once()
            scenario_wall_s = time.monotonic() - wall0 - setup_wall_s
            await self._clear_control_plane()
            await self.observer.finish()
        finally:
            await self._clear_all()
            if not self.options.keep:
                await self.workloads.stop()
        recs = recoveries(self.obs, self.scenario.expect.slo)
        verdict = judge(self.scenario.expect, self.obs, recs)
        pace = await achieved_pace(
            self.clients,
            window,
            pace_scale=self.pace_scale,
            injections=self.obs.injections,
            note=self.observer.note,
        )
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

    def _start_traffic(self) -> None:
        loaded = [w for w in self.scenario.workloads.serving if w.load is not None]
        if not loaded:
            return
        http = self.clients.topology.service(ServiceKind.ROUTER).http_address
        for w in loaded:
            assert w.load is not None
            self.observer.traffic.append(
                Traffic(url=f"http://{http}", model=w.name, load=w.load, clock=self._clock)
            )

    async def _sleep_until(self, emulated_s: float) -> bool:
        """Until `emulated_s` after the workloads were up; False when the run was halted."""
        until_ns = self.obs.start_ns + int(emulated_s * 1e9)
        return not await self._clock.wait(self.observer.halt, until_ns)

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
                if not await self.observer.steady_before():
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
        if self.observer.halt.is_set():  # the attack halts: what is in comes out now
            await self._clear([i for group in live.values() for i in group])
            return
        last = max((a[0] for a in actions), default=0.0)
        await self._watch(last, horizon)

    async def _placement(self, last: Placement) -> Placement:
        """Where the workloads run now; where they ran last when the service that says is down
        (a training job's placement is the manager's to tell: a scenario may have killed it)."""
        try:
            return await self.workloads.placement()
        except EmulatorError as exc:
            self.observer.note(
                f"where the workloads run: {status_line(exc)}; the last placement is used"
            )
            return last

    async def _authority_now_ns(self) -> int:
        """Emulated time now as the clock's authority reads it (sn0's fabric, GetClock), which
        stamps the records an injection is judged against (the manager's incidents and
        restores, in one process). The runner's own clock follows the authority and may read
        ahead of it by up to a lease (`clock.lease_s`, 1 wall s, at the rate) once the
        authority cuts a stall out or slows: at time scale 50 on a loaded host that placed a
        detection 5 emulated s before the injection it was of, which was then judged never
        detected. The runner's reading when the fabric does not answer within AUTHORITY_WALL_S
        (the clock is answered whatever a service fault did to the fabric)."""
        try:
            info = await FabricClient(self.clients).clock(
                deadline_s=AUTHORITY_WALL_S, address=clock_address(self.clients.topology)
            )
        except EmulatorError as exc:
            self.observer.note(f"the fabric's clock, for a stamp: {status_line(exc)}")
            return self._clock.now_ns()
        return info.emulated_ns

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
        at = await self._authority_now_ns()

        async def one(target: str) -> Injection:
            fault_id, why = "", error
            if not why:
                try:
                    fault = await kinds.inject(
                        self.clients, step.fault, target, step.typed_params, step.duration_s
                    )
                    fault_id = fault.id
                except EmulatorError as exc:
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
        self.observer.emit()
        return out

    async def _clear(self, injections: list[Injection], *, record: bool = True) -> None:
        """Clear faults; `record`: the scenario cleared them (a clean-up at the end is not a
        clearance: a fault left until then lasted the whole run)."""
        for inj in injections:
            if not inj.fault_id:
                continue
            try:
                await kinds.clear(self.clients, inj.fault_id)
            except EmulatorError as exc:
                self.obs.notes.append(f"clearing {inj.fault_id}: {status_line(exc)}")
            if not record:
                continue
            cleared_ns = await self._authority_now_ns()
            cleared = Injection(**{**inj.__dict__, "cleared_ns": cleared_ns})
            index = self.obs.injections.index(inj)
            self.obs.injections[index] = cleared
        self.observer.emit()

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
                self.observer.note(note)

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
            if self.observer.all_recovered() and await self.observer.training_back():
                return


async def run_scenario(
    clients: Clients,
    scenario: Scenario,
    options: RunOptions = DEFAULTS,
    *,
    on_entry: Callable[[Entry], None] | None = None,
) -> RunResult:
    return await Runner(clients, scenario, options, on_entry=on_entry).run()
