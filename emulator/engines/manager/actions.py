"""What the cluster manager does about an incident: isolation (Scheduler MarkFailed),
replacement (Scheduler Replace for every job holding the NPU), and the restore, which is the
workloads' own (they watch their allocation): the manager only notes it in the incident once
the workload reports it (a training job on its own server, a serving deployment at the
router). In PASSIVE mode it records and acts on nothing.

Each step goes through the engine's ControlPlane (emulator/engines/peers.py); a step the
scheduler refuses makes the incident unrecoverable, with the reason in its detail.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.engines.manager.status import Mode
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.manager.detector import (
    ISOLATED,
    REPLACED,
    RESTORED,
    UNRECOVERABLE,
    Incident,
)
from cmemu.emulator.model.topology import Device

if TYPE_CHECKING:
    from cmemu.emulator.engines.manager.engine import ManagerEngine

log = structlog.get_logger("cmemu.manager")
# Its own server's health answers at once, but for a stalled host. Wall, not emulated: it asks
# about this process (whether its launcher is stopping it), not about the emulated machine.
OWN_HEALTH_WALL_S = 2.0


class Actions:
    def __init__(self, engine: ManagerEngine) -> None:
        self.engine = engine

    async def act(self, incident: Incident) -> None:
        """Isolate and replace: a die down takes its whole NPU out (the scheduler hands out
        NPUs; a serving deployment isolates the die itself when it sees the NPU failed)."""
        e = self.engine
        if await self._stopping():
            incident.detail += " (the supernode is stopping: not acted on)"
            return
        log.warning("device failed", device=incident.device, by=incident.detected_by)
        e.publish(
            "incident",
            incident=incident.id,
            target=incident.device,
            detected_by=incident.detected_by,
            detail=incident.detail,
        )
        npu = e.npu_of(incident.device)
        device = e.devices[npu or incident.device]
        e.spawn(self._fault_since(incident, device))  # a hung device makes it wait
        if not e.failed(incident.device):
            incident.detail += " (back before it was acted on)"
            return
        if e.mode is not Mode.ACTIVE:
            incident.detail += " (passive: recorded only)"
            return
        if npu is None:
            incident.detail += f" ({device.kind.value}: no scheduler resource to replace)"
            return
        scheduler = e.peers.scheduler()
        try:
            marked = await scheduler.mark_failed(device.id)
            back = not e.failed(incident.device)
            if back and e.whole(device.id):
                await self.mark_healthy(device.id)  # it came back meanwhile: undo
            incident.isolated_ns = e.clock.now_ns()
            incident.jobs = list(marked.affected_jobs)
            e.publish(
                "incident-isolated", incident=incident.id, target=device.id, jobs=incident.jobs
            )
            if back and not incident.jobs:
                # Back while MarkFailed was in flight (a partition shorter than the isolation):
                # it was restored then, and no job needs a replacement. Marked isolated now,
                # nothing would ever move it on (the device answers already).
                incident.state = RESTORED
                incident.restored_ns = incident.restored_ns or incident.isolated_ns
                incident.detail += " (back while it was isolated)"
                return
            incident.state = ISOLATED
            for job in incident.jobs:
                replaced = await scheduler.replace(job, device.id)
                incident.replacements.extend(r.new for r in replaced)
            if incident.jobs:
                incident.state, incident.replaced_ns = REPLACED, e.clock.now_ns()
                e.publish(
                    "incident-replaced",
                    incident=incident.id,
                    target=device.id,
                    replacements=incident.replacements,
                )
        except EmulatorError as exc:
            incident.state = UNRECOVERABLE
            incident.detail += f"; {exc.reason}: {exc}"
            e.publish("incident-unrecoverable", incident=incident.id, error=str(exc))

    async def _stopping(self) -> bool:
        """The manager's own server no longer serves: the launcher is stopping every server,
        and their NOT_SERVING is no fault to act on."""
        e = self.engine
        return not await e.peers.serving(e.address, deadline_s=OWN_HEALTH_WALL_S)

    async def _fault_since(self, incident: Incident, device: Device) -> None:
        """When the device says its fault began (left 0 when it cannot say: crashed, hung)."""
        with contextlib.suppress(EmulatorError):
            peer = self.engine.peers.device(device)
            state = await self.engine.checked(device.id, peer.fault_state(deadline_s=None))
            if state.faulted:
                incident.fault_ns = int(state.since_ns)

    async def mark_healthy(self, npu: str) -> None:
        with contextlib.suppress(EmulatorError):
            await self.engine.peers.scheduler().mark_healthy(npu)

    # --- restore -------------------------------------------------------------------------------

    async def restores(self) -> None:
        """Replaced incidents become restored once every job concerned reports its restore."""
        e = self.engine
        while not e.closed:
            for incident in e.detector.incidents:
                if incident.state == REPLACED:
                    done = [await self._restored_ns(j, incident.replaced_ns) for j in incident.jobs]
                    if all(done):
                        incident.state, incident.restored_ns = RESTORED, max(done)
                        e.publish("incident-restored", incident=incident.id, jobs=incident.jobs)
            await e.clock.sleep(e.profile.manager.heartbeat_interval_s / 4)

    async def _restored_ns(self, job: str, after_ns: int) -> int:
        """When `job` last restored, if after `after_ns` (else 0): a training job of the
        manager's server, or else an instance of a serving deployment ("<deployment>.<n>")."""
        peers = self.engine.peers
        try:
            at = await peers.training().last_restored_ns(job)
            if at is None:
                at = await peers.router().last_restored_ns(job.rsplit(".", 1)[0])
        except EmulatorError:
            return 0
        return at if at >= after_ns else 0
