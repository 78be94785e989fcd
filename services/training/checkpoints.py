"""A training job's checkpoints in EMS: writing one (every NPU's shard, then the manifest that
makes it whole) and reading the latest that verifies back after a failure or a resume.

Kept apart from the runner (job.py), which decides *when* to checkpoint and reload; this is
*how*, against EMS's Put/Get/BatchDelete, including what a corrupt or lost checkpoint costs:
the job falls back to the one before and loses the steps between them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import structlog

from cmemu.emulator.client.ems import EmsClient, ObjectKind
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.model.errors import DataLossError, EmulatorError, NotFoundError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.training import checkpoint
from cmemu.services.rpc import status_line
from cmemu.services.training.live import LiveJob

log = structlog.get_logger("cmemu.training")
NS = 1_000_000_000
CHECKPOINT_KIND = ObjectKind.CHECKPOINT


class Checkpoints:
    """One job's checkpoints: `publish` and `sleep` are its runner's (events under the job's
    name; a sleep a failure or a stop cuts short, returning False)."""

    def __init__(
        self,
        job: LiveJob,
        *,
        ems: EmsClient,
        clock: Timeline,
        profile: HardwareProfile,
        publish: Callable[..., None],
        sleep: Callable[[float], Awaitable[bool]],
    ) -> None:
        self.job = job
        self.ems = ems
        self.clock = clock
        self.profile = profile
        self.publish = publish
        self.sleep = sleep

    async def write(self, *, final: bool = False) -> None:
        """Each NPU's shard as size-only CHECKPOINT objects; the previous checkpoint's objects
        go once this one is whole. The job waits for the slowest write (emulated). `final`: the
        one a stop asked for, which the stop does not cut."""
        job, p = self.job, self.job.progress
        step = p.step
        npus = [n.id for n in job.allocation.npus]
        shards = checkpoint.shards(p.name, step, job.shape, self.profile)
        longest = 0
        try:
            for shard in shards:
                put = await self.ems.put(
                    shard.key,
                    size=shard.size,
                    kind=CHECKPOINT_KIND,
                    device=npus[shard.npu_index],
                )
                longest = max(longest, put.complete_ns - put.issue_ns)
        except EmulatorError as exc:
            # A writer died before the controller noticed: this checkpoint does not count, and
            # the job goes on until its allocation shows the failure (the shards written stay
            # as garbage under a step that is never recorded).
            self.publish("checkpoint-failed", step=step, error=status_line(exc))
            return
        if final:
            await self.clock.sleep(longest / NS)
        elif not await self.sleep(longest / NS):
            return  # a failure during the write: this checkpoint does not count
        keys = [s.key for s in shards]
        manifest = checkpoint.manifest_key(p.name, step)
        try:  # written last: a checkpoint is whole once its manifest is in
            await self.ems.put(
                manifest,
                checkpoint.manifest(p.name, step, keys),
                kind=CHECKPOINT_KIND,
                device=npus[0],
            )
        except EmulatorError as exc:
            self.publish("checkpoint-failed", step=step, error=status_line(exc))
            return
        job.checkpoints.append((step, [*keys, manifest]))
        p.checkpointed(step)
        kept = max(1, self.profile.training.checkpoints_kept)
        while len(job.checkpoints) > kept:
            _, old = job.checkpoints.pop(0)
            await self.ems.delete_many(old)
        self.publish("checkpoint", step=step, bytes=sum(s.size for s in shards))

    async def reload(self) -> None:
        """Read the latest checkpoint that verifies back from EMS onto the (new) NPUs (the
        slowest Get). Its manifest first: one that fails its checksum (DATA_LOSS) or is gone
        (NOT_FOUND) is dropped, published (`checkpoint-corrupt`), and the one before is tried,
        losing the steps between them; with none left the job starts over from step 0."""
        job, p = self.job, self.job.progress
        npus = [n.id for n in job.allocation.npus]
        while job.checkpoints:
            step, keys = job.checkpoints[-1]
            try:
                got = await self.ems.load(keys[-1], device=npus[0])
                shards = checkpoint.manifest_keys(got.data, p.name, step)
            except EmulatorError as exc:
                if job.needs_recovery:
                    return  # a new NPU failed too: recover again
                if not isinstance(exc, DataLossError | NotFoundError):
                    raise
                await self._drop_latest(status_line(exc))
                continue
            except ValueError as exc:  # bytes that verify but are no manifest of this one
                await self._drop_latest(f"not its manifest: {exc}")
                continue
            await self._load(shards, npus)
            return

    async def _drop_latest(self, error: str) -> None:
        """The latest checkpoint did not verify: gone, and the job rewound to the one before."""
        job, p = self.job, self.job.progress
        step, keys = job.checkpoints.pop()
        with contextlib.suppress(EmulatorError):
            await self.ems.delete_many(keys)
        back = job.checkpoints[-1][0] if job.checkpoints else 0
        lost = p.fell_back(back, self.clock.now_ns())
        log.warning("checkpoint corrupt", job=p.name, step=step, error=error)
        self.publish("checkpoint-corrupt", step=step, fallback_step=back, steps_lost=lost,
                     error=error)  # fmt: skip

    async def _load(self, keys: list[str], npus: list[str]) -> None:
        longest = 0
        for key in keys:
            index = int(key.rsplit("/", 1)[1].split("-")[0])
            try:
                got = await self.ems.load(key, device=npus[index])
            except EmulatorError:
                if self.job.needs_recovery:
                    return  # a new NPU failed too: recover again
                raise
            longest = max(longest, got.complete_ns - got.issue_ns)
        await self.sleep(longest / NS)
