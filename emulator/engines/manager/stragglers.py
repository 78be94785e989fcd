"""The cluster manager's slow-device (straggler) detection, in emulated time.

Every `straggler_poll_s` it reads the fabric's collective arrivals since its last read
(Fabric/ListCollectiveArrivals: when each rank was ready), hands them to the pure judge
(emulator/model/manager/straggler.py), and reports each NPU the judge names that is not already
degraded or failed (an incident with detected_by "straggler"). Every `straggler_probe_s` it
runs a diagnosis on each degraded NPU (a kernel timed against its roofline, through `probe`:
the engine's, over the NPU's device peer) and reports the ones at full speed again.
A fabric that cannot be read is tried again at the next poll (its arrivals meanwhile are kept
there, up to the profile's limit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.peers import Directory
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.hardware import ManagerProfile
from cmemu.emulator.model.manager.detector import DEGRADED, Detector, Incident
from cmemu.emulator.model.manager.straggler import StragglerJudge, StragglerSettings

log = structlog.get_logger("cmemu.manager")

Probe = Callable[[str], Awaitable[float]]
"""An NPU's diagnosis: its achieved kernel time over the roofline's (1.0: full speed)."""


class StragglerWatch:
    def __init__(
        self,
        *,
        peers: Directory,
        clock: Timeline,
        detector: Detector,
        settings: ManagerProfile,
        npus: frozenset[str],
        probe: Probe,
        on_incident: Callable[[Incident], None],
        on_recovered: Callable[[str], None],
    ) -> None:
        self.peers = peers
        self.clock = clock
        self.detector = detector
        self.settings = settings
        self.judge = StragglerJudge(StragglerSettings.of(settings))
        self.npus = npus
        self.probe = probe
        self.on_incident = on_incident
        self.on_recovered = on_recovered
        self.after_seq = 0
        self.arrivals = 0  # collectives read
        self.dropped = 0  # collectives the fabric no longer kept when read
        self.detected = 0  # stragglers reported

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._watch(), name="straggler-watch")
            tasks.create_task(self._diagnose(), name="straggler-diagnose")

    async def _watch(self) -> None:
        while True:
            await self.clock.sleep(self.settings.straggler_poll_s)
            await self.read()

    async def read(self) -> None:
        """One read of the fabric's arrivals, judged."""
        try:
            batch = await self.peers.fabric().collective_arrivals(self.after_seq)
        except EmulatorError as exc:
            log.debug("collective arrivals not read", error=str(exc)[:200])
            return
        self.after_seq = batch.last_seq
        self.dropped += batch.dropped
        self.arrivals += len(batch.arrivals)
        for arrival in batch.arrivals:
            self.judge.observe(arrival)
        now = self.clock.now_ns()
        for straggler in self.judge.stragglers(now):
            if straggler.npu not in self.npus:
                continue
            incident = self.detector.degraded(
                straggler.npu, now, straggler.detail, since_ns=straggler.since_ns
            )
            if incident is not None:
                self.detected += 1
                log.warning("straggler", npu=straggler.npu, detail=straggler.detail)
                self.on_incident(incident)

    async def _diagnose(self) -> None:
        limit = self.settings.straggler_lag_ratio
        while True:
            await self.clock.sleep(self.settings.straggler_probe_s)
            for npu in sorted(self.npus):
                if self.detector.devices.get(npu) != DEGRADED:
                    continue
                try:
                    ratio = await self.probe(npu)
                except EmulatorError as exc:
                    log.debug("straggler diagnosis failed", npu=npu, error=str(exc)[:200])
                    continue
                if ratio < limit and self.detector.recovered(npu):
                    self.judge.forget(npu)
                    self.on_recovered(npu)
