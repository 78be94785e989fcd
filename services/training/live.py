"""A live training job's state, shared by its runner (job.py), its checkpoints
(checkpoints.py) and the service (service.py): the allocation the scheduler gave it, the
checkpoints it keeps in EMS, and the events that cut its sleeps short."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from cmemu.emulator.client.ems import EmsClient
from cmemu.emulator.client.scheduler import Allocation, SchedulerClient
from cmemu.emulator.engines.peers import FabricPeer
from cmemu.emulator.model.training.job import JobProgress
from cmemu.emulator.model.training.spec import TrainingShape
from cmemu.v1 import training_pb2

NO_ALLOCATION = Allocation(
    job="",
    npus=(),
    nodes=(),
    racks=(),
    policy="",
    priority=0,
    whole_nodes=False,
    same_rack=False,
    allocated_ns=0,
)
"""A job's allocation before the scheduler granted one."""


@dataclass(frozen=True, kw_only=True)
class Endpoints:
    """The services a job calls: each raises the EmulatorError its status names."""

    scheduler: SchedulerClient
    ems: EmsClient
    # the fabric's engine when this process hosts it, else its client; asked at each call (the
    # runtime may host the fabric here after the service was built)
    fabric: Callable[[], FabricPeer]


@dataclass(kw_only=True)
class LiveJob:
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

    def message(self, now_ns: int) -> training_pb2.TrainingJob:
        p = self.progress
        return training_pb2.TrainingJob(
            name=p.name,
            state=p.state,
            step=p.step,
            last_checkpoint_step=p.last_checkpoint_step,
            npus=[n.id for n in self.allocation.npus],
            restarts=p.restarts,
            steps_lost=p.steps_lost,
            step_s=p.step_s,
            started_ns=p.started_ns,
            last_failure_ns=p.last_failure_ns,
            last_restored_ns=p.last_restored_ns,
            goodput=p.goodput(now_ns),
            failed_steps=p.failed_steps,
            last_corrupt_checkpoint_ns=p.last_corrupt_checkpoint_ns,
        )
