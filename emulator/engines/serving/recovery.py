"""A serving deployment riding out faults: it watches its scheduler allocations and its own calls.

The scheduler is the single source of truth (issue 11): a controller (the cluster manager, or a
user's own) marks an NPU failed and replaces it there, and never tells the workload directly.
This watcher follows the deployment's jobs through `Scheduler/WatchAllocations` (falling back to
polling GetAllocation every heartbeat interval of emulated time where the scheduler has no such
stream) and:
- isolates at once an NPU of its allocation that is marked failed (the driver takes its dies out
  of the instance: experts to redundant slots, its requests retried or failed visibly);
- restores onto the replacement NPU when the allocation shows one: the instance's share of the
  weights loads through EMS (the model-caching warm path, cold where EMS lost them), a KV region
  is reserved on a decode NPU, and after that emulated loading time the dies come back;
- probes the NPUs a failed step ran on (a device that stops answering, or reports a fault, is
  isolated without waiting for the controller) and restores one of those in place once it
  answers again and the scheduler has not failed it.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.peers import JobScheduler
from cmemu.emulator.engines.serving.deploy import (
    WEIGHTS_KIND,
    LiveDeployment,
    Provisioner,
    weight_plan,
)
from cmemu.emulator.engines.serving.driver import Driver
from cmemu.emulator.engines.serving.measures import LiveInstance
from cmemu.emulator.engines.serving.peers import ServingDirectory
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, code_of
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.scheduler.grants import Allocation
from cmemu.emulator.model.serving.engine import StepPlan
from cmemu.emulator.model.topology import Device, Topology

log = structlog.get_logger("cmemu.router")

SCHEDULER = "scheduler"  # causes of an isolation, in the `isolated` event
UNANSWERED = "unanswered"
REPLACED = "replaced"
# Never poll faster than this in wall time, whatever the time scale: a cap on what the poll
# costs this host (the scheduler's answers), not a bound on anyone's answer, so it stays wall.
MIN_TICK_WALL_S = 0.05


class Recovery:
    """One deployment's watcher (a task of the router's TaskGroup, cancelled on undeploy)."""

    def __init__(
        self,
        *,
        live: LiveDeployment,
        driver: Driver,
        provisioner: Provisioner,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: ServingDirectory,
    ) -> None:
        self.live = live
        self.driver = driver
        self.provisioner = provisioner
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.scheduler: JobScheduler = provisioner.scheduler
        self.instances = {job: inst for inst, job in live.allocations.items()}
        self.causes: dict[str, str] = {}  # isolated npu: why
        self.streaming = False
        self._restoring: set[str] = set()  # new npus loading
        self._probing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        driver.prober = self.probe

    def job(self, instance: str) -> str:
        return self.live.allocations.get(instance, "")

    # --- the loops ------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._watch())
                tasks.create_task(self._tick())
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _pause(self) -> None:
        """A heartbeat interval of emulated time (counted at the wall rate of its start, a
        clock slowed meanwhile brought the next poll and probe early: a stretched step then
        looked unanswered), and never under MIN_TICK_WALL_S of wall time."""
        await asyncio.gather(
            self.clock.sleep(self.profile.manager.heartbeat_interval_s),
            asyncio.sleep(MIN_TICK_WALL_S),
        )

    async def _watch(self) -> None:
        """The allocation stream; on UNIMPLEMENTED polling takes over (in `_tick`) for good."""
        while True:
            try:
                changes = self.scheduler.watch()
                try:
                    self.streaming = True
                    await self._poll()  # what changed before the stream opened
                    async for event in changes:
                        instance = self.instances.get(event.allocation.job)
                        if instance is not None:
                            await self._reconcile(instance, event.allocation)
                finally:
                    changes.cancel()
            except EmulatorError as exc:
                self.streaming = False
                if code_of(exc) == "UNIMPLEMENTED":
                    log.info("no allocation stream; polling", deployment=self.live.name)
                    return
                log.warning("allocation stream broke", deployment=self.live.name, error=str(exc))
            except Exception:  # never take the router down: polling goes on
                log.exception("allocation watch failed", deployment=self.live.name)
            self.streaming = False
            await self._pause()

    async def _tick(self) -> None:
        """Every heartbeat interval: poll when there is no stream, and probe again the NPUs this
        deployment isolated itself."""
        while True:
            await self._pause()
            try:
                if not self.streaming:
                    await self._poll()
                await self._reprobe()
            except EmulatorError as exc:
                log.warning("recovery tick failed", deployment=self.live.name, error=str(exc))
            except Exception:  # never take the router down
                log.exception("recovery tick failed", deployment=self.live.name)

    async def _poll(self) -> None:
        for job, instance in list(self.instances.items()):
            try:
                allocation = await self.scheduler.allocation(job)
            except NotFoundError:
                continue
            await self._reconcile(instance, allocation)

    # --- what the allocation says ---------------------------------------------------------------

    async def _reconcile(self, instance: str, allocation: Allocation) -> None:
        driver = self.driver
        held = [d.id for d in driver.instances[instance].npus]
        now = {n.id: n for n in allocation.npus}
        failed = [n for n in held if n in now and now[n].failed]
        for npu in driver.isolation.isolate(failed, SCHEDULER, self.job):
            self.causes[npu] = SCHEDULER
        gone = sorted(n for n in held if n not in now)
        fresh = sorted(n for n in now if n not in held and n not in self._restoring)
        for old, new in zip(gone, fresh, strict=False):
            for npu in driver.isolation.isolate([old], REPLACED, self.job):
                self.causes[npu] = REPLACED
            self._start_restore(instance, old, new)
        for npu in held:  # back in service in place: the controller marked it healthy
            back = npu in now and not now[npu].failed and self.causes.get(npu) == SCHEDULER
            if back and npu not in driver.isolation.recovering:
                self._start_restore(instance, npu, npu)

    def _start_restore(self, instance: str, old: str, new: str) -> None:
        self.driver.isolation.recovering.add(old)
        self._restoring.add(new)
        task = asyncio.get_running_loop().create_task(
            self._restore(instance, old, new), name=f"{self.live.name}-restore-{new}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restore(self, instance: str, old: str, new: str) -> None:
        """Load the instance's weights onto `new` through EMS, reserve its KV region, and once
        that emulated time has passed bring the dies back."""
        started_s = self.driver.engine_now_s()
        device = self.topology.device(new)
        try:
            load_s = await self._load_weights(new)
            offset = await self._kv_region(instance, old, device)
        except Exception as exc:  # an RPC, EMS, the device: the NPU stays out
            log.warning(
                "restore failed; the NPU stays isolated",
                deployment=self.live.name,
                npu=new,
                error=str(exc),
            )
            self.driver.isolation.recovering.discard(old)
            self._restoring.discard(new)
            return
        ready_s = started_s + load_s
        await self.clock.sleep_until(round(ready_s * 1e9))
        self.driver.isolation.restore(old, device, offset, ready_s, self.job)
        self.causes.pop(old, None)
        self._restoring.discard(new)

    async def _load_weights(self, npu: str) -> float:
        """The instance's share of the weights from EMS (cold for shards EMS lost, which are
        cached again): emulated seconds, the published model-caching point over its instances."""
        plan = self.live.weights or weight_plan(self.live.spec, self.profile)
        ems = self.provisioner.ems
        present = await ems.exist([k for k, _ in plan.shards])
        for (key, size), there in zip(plan.shards, present, strict=True):
            if not there:
                await ems.put(key, size=size, kind=WEIGHTS_KIND, device=npu)
        s = self.profile.serving
        whole = s.cache_from_ems_s if all(present) else s.cache_cold_s
        return whole / s.cache_instances

    async def _kv_region(self, instance: str, old: str, device: Device) -> int | None:
        """A decode NPU's KV region on the new NPU (the old one's is given back, if it can be)."""
        if self.live.roles.get(instance) != "decode":
            return None
        if device.id != old:
            for npu, region_id in [r for r in self.live.regions if r[0] == old]:
                self.live.regions.remove((npu, region_id))
                with contextlib.suppress(EmulatorError):  # a hung one: given up on, in time
                    await self.provisioner.free_region(self.topology.device(npu), region_id)
        else:
            inst: LiveInstance = self.driver.instances[instance]
            k = [d.id for d in inst.npus].index(old)
            return inst.kv_offsets[k] if inst.kv_offsets else None
        region = await self.provisioner.allocate_region(
            device, self.profile.npu.hbm_bytes_per_die, f"kv/{self.live.name}"
        )
        self.live.regions.append((device.id, region.region_id))
        return int(region.offset)

    # --- probing --------------------------------------------------------------------------------

    async def _answers(self, device: Device) -> bool:
        """Whether `device` answers in time and reports no fault and no die down."""
        try:
            async with self.driver.step_deadline():
                seen = await self.peers.device(device).telemetry(deadline_s=None)
        except (TimeoutError, EmulatorError):
            return False
        return not (seen.faulted or seen.dies_down)

    async def probe(self, name: str, plan: StepPlan, error: str, dead: str = "") -> None:
        """A step failed: isolate at once the NPU of the rank the fabric named dead (its die
        down, or all of it), and the NPUs it ran on that do not answer."""
        npu = dead.split(".", 1)[0]
        if npu and npu in {d.id for d in self.driver.pairs(plan)}:
            for taken in self.driver.isolation.isolate([npu], UNANSWERED, self.job):
                self.causes[taken] = UNANSWERED
                log.warning("isolated an NPU with a dead rank", deployment=name, npu=taken)
        devices = [d for d in self.driver.pairs(plan) if d.id not in self._probing]
        self._probing.update(d.id for d in devices)
        try:
            answers = await asyncio.gather(*(self._answers(d) for d in devices))
        finally:
            self._probing.difference_update(d.id for d in devices)
        down = [d.id for d, ok in zip(devices, answers, strict=True) if not ok]
        for npu in self.driver.isolation.isolate(down, UNANSWERED, self.job):
            self.causes[npu] = UNANSWERED
            log.warning("isolated an NPU that stopped answering", deployment=name, npu=npu)

    async def _reprobe(self) -> None:
        """NPUs isolated for not answering come back in place once they answer (unless the
        scheduler failed them meanwhile: then its replacement brings them back)."""
        for npu, cause in list(self.causes.items()):
            if cause != UNANSWERED or npu in self.driver.isolation.recovering:
                continue
            found = self.driver.isolation.locate(npu)
            if found is None:
                continue
            if await self._answers(self.topology.device(npu)):
                self.causes[npu] = SCHEDULER  # restored like one the controller healed
                allocation = await self.scheduler.allocation(self.job(found[0]))
                await self._reconcile(found[0], allocation)
