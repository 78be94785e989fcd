"""The training jobs of this process, as the scheduler's day plans start and stop their job
(DayTraining, emulator/engines/dayplan.py; its other implementation is the typed gRPC client,
emulator/client/dayplan.py RemoteDayTraining).

Each call goes through the outage of the cluster manager's service, whose server hosts the jobs'
API (engines/training/engine.py; runtime/servicecontrol.py sets it), so a manager killed, hung,
slowed or cut off in one process looks to a day plan as it does across processes. A refusal is
the engine's EmulatorError prefixed "training: ", as the remote peer reads a relayed status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from cmemu.emulator.engines.training.engine import TrainingEngine
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, relayed
from cmemu.emulator.model.training.spec import TrainingSpec

RELAYED_BY = "training"
T = TypeVar("T")


class LocalDayTraining:
    """What cmemu.v1.Training's Start, Stop and Get answer a day plan over gRPC, asked of the
    engine."""

    def __init__(self, engine: TrainingEngine) -> None:
        self.engine = engine
        self.outage = engine.outage

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call` once the manager's service admits it (no deadline: as the remote peer sets
        none)."""
        try:
            await self.outage.admit(None)
            return await call()
        except EmulatorError as exc:
            raise relayed(exc, RELAYED_BY) from exc

    async def start(self, job: TrainingSpec, *, resume: bool) -> int:
        async def start() -> int:
            return (await self.engine.start(job, resume=resume)).progress.step

        return await self._call(start)

    async def stop(self, job: str, *, checkpoint: bool) -> None:
        async def stop() -> None:
            await self.engine.stop(job, checkpoint=checkpoint)

        await self._call(stop)

    async def progress(self, job: str) -> tuple[str, int]:
        async def progress() -> tuple[str, int]:
            p = self.engine.get(job).progress
            return p.state, p.step

        try:
            return await self._call(progress)
        except NotFoundError:
            return "", 0
