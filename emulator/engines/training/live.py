"""A live training job's state, shared by its runner (runner.py), its checkpoints
(checkpoints.py) and the jobs table (engine.py): the allocation the scheduler gave it, the
checkpoints it keeps in EMS, and the events that cut its sleeps short. Domain values only: the
service (services/training/) reports a job from its `progress` and `allocation`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cmemu.emulator.engines.peers import FabricPeer, JobScheduler, ObjectStore
from cmemu.emulator.model.scheduler.grants import NO_ALLOCATION, Allocation
from cmemu.emulator.model.training.spec import TrainingShape

if TYPE_CHECKING:  # a job's step model (the training cost models): with the first job, not at boot
    from cmemu.emulator.model.training.job import JobProgress


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """The services a job calls, as their peers (engines/peers.py): a refusal or an
    unreachable service is an EmulatorError, wherever the service lives."""

    scheduler: JobScheduler
    ems: ObjectStore
    # the fabric's engine when this process hosts it, else its client; asked at each call (the
    # runtime may host the fabric here after the service was built)
    fabric: Callable[[], FabricPeer]


@dataclass(kw_only=True)
class LiveJob:
    """One job as it runs: what it was asked (`shape`), how far it is (`progress`), the NPUs it
    holds now, and what its runner waits on."""

    shape: TrainingShape
    progress: JobProgress
    allocation: Allocation = field(default_factory=lambda: NO_ALLOCATION)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # the checkpoints kept in EMS, oldest first: (step, its objects' keys, the manifest's last)
    checkpoints: list[tuple[int, list[str]]] = field(default_factory=list)
    # set by a "failed" or "replaced" change: the job lost an NPU, even when the replacement
    # shows before the job looks (its state on that NPU is gone either way)
    interrupted: bool = False
    resuming: bool = False  # started with `resume` from a stopped job's checkpoints
    final_checkpoint: bool = False  # stopped with `checkpoint`: write one before ending

    @property
    def failed_npus(self) -> list[str]:
        return [n.id for n in self.allocation.npus if n.failed]

    @property
    def needs_recovery(self) -> bool:
        return self.interrupted or bool(self.failed_npus)

    @property
    def dies(self) -> list[str]:
        return [d for n in self.allocation.npus for d in n.dies]
