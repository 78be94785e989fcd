"""What a chaos run sees: the workloads' status, the manager's incidents, the background load's
requests, gathered into the run's Observations as it goes, with the scenario's abort bounds
checked on every poll and the timeline's new entries handed out as they happen.

The runner (runner.py) decides when to inject and clear; this only reads, through the same
public APIs, and never fails the run for a service that does not answer: it notes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.manager import ManagerClient
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.chaos.abort import crossed
from cmemu.emulator.model.chaos.observed import IncidentRecord, Observations
from cmemu.emulator.model.chaos.recovery import recoveries
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.model.chaos.timeline import Entry, build_timeline
from cmemu.emulator.model.chaos.verdict import steady_before
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.manager.detector import Incident
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.chaos.traffic import Traffic
from cmemu.emulator.runtime.chaos.workloads import STATUS_WALL_S, Workloads
from cmemu.services.rpc import status_line

POLL_WALL_S = (0.02, 0.25)  # the status poll's period bounds, wall seconds


class Observer:
    """One run's observations, and the polls that fill them."""

    def __init__(
        self,
        *,
        clients: Clients,
        scenario: Scenario,
        workloads: Workloads,
        clock: Callable[[], Timeline],
        on_entry: Callable[[Entry], None] | None = None,
    ) -> None:
        self.clients = clients
        self.scenario = scenario
        self.workloads = workloads
        self._clock = clock  # the emulator's time, followed once the run starts
        self.on_entry = on_entry
        self.has_manager = any(s.kind == ServiceKind.MANAGER for s in clients.topology.services)
        self._manager = (
            ManagerClient(clients, timeout_s=STATUS_WALL_S) if self.has_manager else None
        )
        loads = scenario.workloads
        self.obs = Observations(
            start_ns=0,
            loaded=tuple(w.name for w in loads.serving if w.load is not None),
            jobs=tuple(w.name for w in loads.training),
        )
        self.traffic: list[Traffic] = []
        self.halt = asyncio.Event()  # an abort condition crossed (scenario `abort:`)
        self._printed: set[tuple[int, str, str]] = set()

    def note(self, note: str) -> None:
        if note not in self.obs.notes:
            self.obs.notes.append(note)

    async def poll_loop(self) -> None:
        clock = self._clock()
        period = min(max(clock.clock.wall_delay_s(1.0), POLL_WALL_S[0]), POLL_WALL_S[1])
        while True:
            await self.poll_once()
            await asyncio.sleep(period)

    async def poll_once(self) -> None:
        try:
            self.obs.events += await self.workloads.poll()
        except EmulatorError as exc:
            self.note(f"workload status: {status_line(exc)}")
        if self._manager is not None:
            try:
                listed = await self._manager.incidents(since_ns=self.obs.start_ns)
                aliases = self.workloads.aliases
                self.obs.incidents = [_record(i, aliases) for i in listed]
            except EmulatorError as exc:
                self.note(f"cluster manager: {status_line(exc)}")
        else:
            self.note("no cluster manager in this emulator: no incidents observed")
        self.obs.end_ns = self._clock().now_ns()
        self.obs.requests = [s for t in self.traffic for s in t.samples]
        self.emit()
        self._check_abort()

    def _check_abort(self) -> None:
        bounds = self.scenario.abort
        if bounds is None or self.halt.is_set():
            return
        why = crossed(bounds, self.obs)
        if why:
            self.obs.aborted, self.obs.aborted_ns = why, self._clock().now_ns()
            self.note(f"aborted: {why}")
            self.halt.set()

    async def steady_before(self) -> bool:
        """The steady-state hypothesis, at the first fault's instant (before it goes in)."""
        if self.scenario.expect.steady_state is None:
            return True
        await self.poll_once()
        self.obs.steady_ns = self._clock().now_ns()
        if self._manager is not None:
            try:
                listed = await self._manager.incidents(since_ns=0)
                aliases = self.workloads.aliases
                self.obs.open_before = [_record(i, aliases) for i in listed]
            except EmulatorError as exc:
                self.note(f"cluster manager: {status_line(exc)}")
        check = steady_before(self.scenario.expect, self.obs)
        if check is not None and not check.ok:
            self.obs.halted = check.detail
            self.note(f"nothing injected: {check.detail}")
            return False
        return True

    async def training_back(self) -> bool:
        try:
            return await self.workloads.training_back()
        except EmulatorError as exc:
            self.note(f"training status: {status_line(exc)}")
            return False

    def all_recovered(self) -> bool:
        self.obs.end_ns = self._clock().now_ns()
        recs = recoveries(self.obs, self.scenario.expect.slo)
        need_slo = self.scenario.expect.slo is not None
        return all(r.settled and (not need_slo or not r.affected or r.slo_back_ns) for r in recs)

    async def finish(self) -> None:
        """The records read once at the end: requests, training, EMS objects lost."""
        self.obs.requests = [s for t in self.traffic for s in t.samples]
        if self.scenario.workloads.serving:
            self.obs.dropped_requests = await self.workloads.dropped_requests()
        if self.scenario.workloads.training:
            try:
                self.obs.training = await self.workloads.training_records()
            except EmulatorError as exc:  # the manager that hosts them is down
                self.note(f"training records: {status_line(exc)}")
        ems = self.scenario.workloads.ems
        if ems is not None:
            self.obs.objects = ems.objects
            self.obs.lost_objects = await self.workloads.lost_objects()
        self.obs.end_ns = self._clock().now_ns()

    def emit(self) -> None:
        """Hand the timeline's new entries to on_entry, as they happen."""
        if self.on_entry is None:
            return
        for entry in build_timeline(self.obs, []):
            key = (entry.at_ns, entry.phase, entry.subject)
            if key not in self._printed:
                self._printed.add(key)
                self.on_entry(entry)


def _record(i: Incident, aliases: dict[str, str]) -> IncidentRecord:
    """An incident as the manager's client reads it (emulator/client/manager.py), its jobs named
    as the scenario names its workloads."""
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
