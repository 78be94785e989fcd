"""A scenario's workloads through the public APIs: serving deployments (Router/Deploy), training
jobs (Training/Start), EMS objects (Ems/Put); where they run (for the selectors); their status
as isolation and restore events (for the timeline); and their removal at the end.

Every call goes through the typed clients (emulator/client/), so a failure is one EmulatorError
type whatever the service; status polls carry a wall deadline (STATUS_WALL_S)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass, field

import yaml

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.deployments import DeploymentState
from cmemu.emulator.client.ems import EmsClient, ObjectKind
from cmemu.emulator.client.router import RouterClient
from cmemu.emulator.client.training import TrainingClient
from cmemu.emulator.model.chaos.observed import CORRUPT_CHECKPOINT, TrainingRecord, WorkloadEvent
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.model.chaos.selectors import Placement
from cmemu.emulator.model.chaos.workloads import EmsWorkload
from cmemu.emulator.model.errors import (
    CapacityError,
    DeadlineExceededError,
    EmulatorError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
)
from cmemu.emulator.model.naming import device_of
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.model.training.job import ENDED

INLINE_BYTES_MAX = 4096  # objects up to this size carry real bytes (checked on the way back)
LOST_WAIT_S = 10.0  # wall seconds the objects' check waits out a store that refuses for now
LOST_RETRY_S = 0.5  # ... asking again this often (sooner when the refusal says so)
# a status call's wall deadline: a hung or partitioned service (the manager hosts the training
# jobs) answers nothing, and the runner must go on (noted, asked again at the next poll)
STATUS_WALL_S = 5.0
STOP_WALL_S, STOP_POLL_WALL_S = 60.0, 0.2  # a run's jobs ending at its end (wall: a bound)


@dataclass(kw_only=True)
class _Seen:
    """The last status values seen of one workload, to turn changes into events."""

    isolated_ns: int = 0
    restored_ns: int = 0
    corrupt_ns: int = 0  # a training job's last restore that found its checkpoint corrupt
    npus: tuple[str, ...] = ()


@dataclass(kw_only=True)
class Workloads:
    clients: Clients
    scenario: Scenario
    warm: bool = False  # deployments start warm: their weights staged in EMS (RunOptions.warm)
    started: list[str] = field(default_factory=list)
    training_start: dict[str, int] = field(default_factory=dict)
    # each training job's step when its last restore was seen: it is back once it passes it
    restored_at_step: dict[str, int] = field(default_factory=dict)
    # scheduler allocation (job) names -> the workload that holds them ("chat.decode-0" -> "chat")
    aliases: dict[str, str] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)

    # --- start ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Every workload of the scenario, running (deployments serving) when this returns."""
        w = self.scenario.workloads
        router = RouterClient(self.clients)
        for s in w.serving:
            # a scenario runs on whichever supernode is up: its deployment is for that preset
            document = {**s.spec, "preset": self.clients.topology.preset}
            deployed = await router.deploy(
                s.name, spec_yaml=yaml.safe_dump(document), wait=True, warm=self.warm
            )
            self.started.append(f"serving:{s.name}")
            if deployed.state is not DeploymentState.SERVING:
                state = deployed.state.value if deployed.state is not None else "?"
                raise PreconditionError(f"deployment {s.name} is {state}: {deployed.error}")
        if w.training:
            self._need(ServiceKind.MANAGER, "training workloads")
        for t in w.training:
            job = await TrainingClient(self.clients).start(t)
            self.started.append(f"training:{t.name}")
            self.training_start[t.name] = job.step
        if w.ems is not None:
            await self._put_objects(w.ems)

    def _need(self, kind: ServiceKind, what: str) -> None:
        if not any(s.kind == kind for s in self.clients.topology.services):
            raise PreconditionError(
                f"{what} need the {kind.value} service, which this emulator lacks"
            )

    def _router(self) -> RouterClient:
        """The router, each call within STATUS_WALL_S."""
        return RouterClient(self.clients, timeout_s=STATUS_WALL_S)

    def _training(self) -> TrainingClient:
        """The training jobs, each call within STATUS_WALL_S."""
        return TrainingClient(self.clients, timeout_s=STATUS_WALL_S)

    @staticmethod
    def _payload(ems: EmsWorkload, i: int) -> bytes:
        seed = zlib.crc32(f"{ems.prefix}{i}".encode())
        return bytes((seed + j * 31) % 256 for j in range(ems.size))

    async def _put_objects(self, ems: EmsWorkload) -> None:
        client = EmsClient(self.clients)
        for i in range(ems.objects):
            inline = ems.size <= INLINE_BYTES_MAX
            await client.put(
                f"{ems.prefix}{i}",
                self._payload(ems, i) if inline else b"",
                size=0 if inline else ems.size,
                kind=ObjectKind(ems.kind),
            )

    async def lost_objects(self, *, wait_s: float = LOST_WAIT_S) -> int:
        """Objects put before the first fault that are gone or changed now: the store says
        so (NOT_FOUND, DATA_LOSS) or answers other bytes. A refusal that says to try again (a
        store still rebuilding its index or restarting, a busy host's deadline: UNAVAILABLE,
        RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) is asked again for up to `wait_s` wall
        seconds in all, and counts as lost only after that (an object nobody can read is lost
        to its users); any other error counts as well, as before."""
        ems = self.scenario.workloads.ems
        assert ems is not None
        client = EmsClient(self.clients)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait_s
        lost = 0
        for i in range(ems.objects):
            inline = ems.size <= INLINE_BYTES_MAX
            while True:
                try:
                    got = await client.load(f"{ems.prefix}{i}", device="")
                except (UnavailableError, CapacityError, DeadlineExceededError) as exc:
                    if loop.time() < give_up:
                        await asyncio.sleep(min(exc.retry_after_s or LOST_RETRY_S, LOST_RETRY_S))
                        continue
                    lost += 1
                except EmulatorError:  # NOT_FOUND, DATA_LOSS: gone
                    lost += 1
                else:
                    if got.size != ems.size or (inline and got.data != self._payload(ems, i)):
                        lost += 1
                break
        return lost

    # --- where they run ------------------------------------------------------------------------

    async def placement(self) -> Placement:
        deployments: dict[str, dict[str, list[str]]] = {}
        for s in self.scenario.workloads.serving:
            d = await self._router().get(s.name)
            roles: dict[str, list[str]] = {}
            for inst in d.instances:
                roles.setdefault(inst.role, []).extend(inst.npus)
                if inst.allocation:
                    self.aliases[inst.allocation] = s.name
            deployments[s.name] = roles
        jobs: dict[str, list[str]] = {}
        for t in self.scenario.workloads.training:
            jobs[t.name] = list((await self._training().get(t.name)).npus)
        return Placement(deployments=deployments, jobs=jobs)

    # --- status as events ----------------------------------------------------------------------

    def _changes(
        self, name: str, isolated_ns: int, restored_ns: int, npus: tuple[str, ...], detail: str
    ) -> list[WorkloadEvent]:
        seen = self._seen.setdefault(name, _Seen(isolated_ns=isolated_ns, restored_ns=restored_ns))
        out = []
        if isolated_ns > seen.isolated_ns:
            out.append(WorkloadEvent(at_ns=isolated_ns, workload=name, what="isolated",
                                     npus=npus or seen.npus, detail=detail))  # fmt: skip
        if restored_ns > seen.restored_ns:
            out.append(WorkloadEvent(at_ns=restored_ns, workload=name, what="restored",
                                     detail=detail))  # fmt: skip
        seen.isolated_ns, seen.restored_ns = isolated_ns, restored_ns
        if npus:
            seen.npus = npus
        return out

    async def poll(self) -> list[WorkloadEvent]:
        """New isolation and restore events since the last poll."""
        out: list[WorkloadEvent] = []
        for s in self.scenario.workloads.serving:
            d = await self._router().get(s.name)
            failed = tuple(sorted({device_of(die) for die in d.failed_dies}))
            out += self._changes(s.name, d.last_isolated_ns, d.last_restored_ns, failed, d.health)
        for t in self.scenario.workloads.training:
            job = await self._training().get(t.name)
            before = self._seen.get(t.name)
            npus = before.npus if before and before.npus else tuple(job.npus)
            changes = self._changes(t.name, job.last_failure_ns, job.last_restored_ns, npus,
                                    f"{job.state} step {job.step}")  # fmt: skip
            if any(c.what == "restored" for c in changes):
                self.restored_at_step[t.name] = job.step
            seen = self._seen[t.name]
            if job.last_corrupt_checkpoint_ns > seen.corrupt_ns:
                seen.corrupt_ns = job.last_corrupt_checkpoint_ns
                what, state = CORRUPT_CHECKPOINT, job.state
                changes.append(
                    WorkloadEvent(at_ns=seen.corrupt_ns, workload=t.name, what=what, detail=state)
                )
            out += changes
            self._seen[t.name].npus = tuple(job.npus)
        return out

    async def training_back(self) -> bool:
        """Every restored training job has finished a step since its restore: the workload is
        back, not only its devices (a run that ends at the restore cannot tell a job that
        resumes from one that never steps again)."""
        for name, step in self.restored_at_step.items():
            job = await self._training().get(name)
            if job.state == "running" and job.step <= step:
                return False
        return True

    async def dropped_requests(self) -> int:
        return (await self._router().stats()).requests_dropped

    async def training_records(self) -> list[TrainingRecord]:
        out = []
        for t in self.scenario.workloads.training:
            job = await self._training().get(t.name)
            out.append(
                TrainingRecord(
                    name=t.name,
                    state=job.state,
                    step_at_start=self.training_start.get(t.name, 0),
                    step=job.step,
                    restarts=job.restarts,
                    steps_lost=job.steps_lost,
                    goodput=job.goodput,
                    last_failure_ns=job.last_failure_ns,
                    last_restored_ns=job.last_restored_ns,
                )
            )
        return out

    # --- stop ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Undo what start did, best effort: a workload already gone is fine."""
        calls: list[Awaitable[object]] = []
        for started in reversed(self.started):
            kind, _, name = started.partition(":")
            if kind == "serving":
                calls.append(RouterClient(self.clients).undeploy(name))
            else:
                calls.append(self._stopped(name))
        ems = self.scenario.workloads.ems
        if ems is not None:
            client = EmsClient(self.clients)
            calls += [client.delete(f"{ems.prefix}{i}") for i in range(ems.objects)]
        await asyncio.gather(*calls, return_exceptions=True)
        self.started.clear()

    async def _stopped(self, name: str) -> None:
        """A job of the run stopped for good before the run returns, so that a next run may
        start one of the same name: a Stop the training service did not answer (its server just
        back from a fault, under load) is sent again, and the job is followed until it has ended
        (a recovering one ends once it sees the stop), within STOP_WALL_S."""
        loop = asyncio.get_running_loop()
        until = loop.time() + STOP_WALL_S
        while loop.time() < until:
            try:
                job = await self._training().stop(name)
            except NotFoundError:
                return
            except EmulatorError:
                pass
            else:
                if job.state in ENDED:
                    return
            await asyncio.sleep(STOP_POLL_WALL_S)
