"""The training jobs of a running emulator (cmemu.v1.Training, on the manager's server) as a
program (or `cmemu train`) calls them: start, list, get, stop, with plain values in and out.
Every failure is the EmulatorError its status names, the server's message unprefixed."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.v1 import training_pb2, training_pb2_grpc


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """A job as the service reports it now (see cmemu.v1.TrainingJob for each figure)."""

    name: str
    state: str  # starting | running | recovering | finished | failed | stopped
    step: int
    last_checkpoint_step: int
    npus: tuple[str, ...]
    restarts: int
    steps_lost: int
    step_s: float  # emulated seconds per step
    started_ns: int
    last_failure_ns: int
    last_restored_ns: int
    goodput: float  # useful step time / elapsed emulated time, 0..1
    failed_steps: int
    last_corrupt_checkpoint_ns: int


class TrainingClient:
    """The training jobs of `clients`' supernode, over its channels (not closed here)."""

    def __init__(self, clients: Clients, *, timeout_s: float | None = None) -> None:
        """`timeout_s`: every call's wall deadline (None: none), for a caller that must go on
        when the service hangs (the chaos runner's status polls)."""
        self._timeout_s = timeout_s
        address = clients.topology.service(ServiceKind.MANAGER).address
        self._stub = training_pb2_grpc.TrainingStub(clients.channel_to(address))

    async def start(self, spec: TrainingSpec, *, resume: bool = False) -> TrainingJob:
        """Start `spec` (for `spec.steps` steps, 0: until stopped); `resume` goes on from the
        last checkpoint of a stopped job of its name."""
        if spec.npus < 1:
            raise InvalidArgumentError(f"npus must be >= 1, got {spec.npus}", field="spec.npus")
        if spec.steps < 0:
            raise InvalidArgumentError(f"steps must be >= 0, got {spec.steps}", field="spec.steps")
        wire = training_spec(spec)
        wire.resume = resume
        request = training_pb2.StartTrainingRequest(spec=wire)
        return _job(await reply_of(None, self._stub.Start(request, timeout=self._timeout_s)))

    async def list(self) -> list[TrainingJob]:
        reply = await reply_of(
            None, self._stub.List(training_pb2.ListTrainingRequest(), timeout=self._timeout_s)
        )
        return [_job(j) for j in reply.jobs]

    async def get(self, name: str) -> TrainingJob:
        """A job by name (NotFoundError for none)."""
        request = training_pb2.TrainingRequest(name=name)
        return _job(await reply_of(None, self._stub.Get(request, timeout=self._timeout_s)))

    async def stop(self, name: str, *, checkpoint: bool = False) -> TrainingJob:
        """Stop a job and release its NPUs; `checkpoint` writes one of its last step first."""
        request = training_pb2.TrainingRequest(name=name, checkpoint=checkpoint)
        return _job(await reply_of(None, self._stub.Stop(request, timeout=self._timeout_s)))


def _job(m: training_pb2.TrainingJob) -> TrainingJob:
    return TrainingJob(
        name=m.name,
        state=m.state,
        step=m.step,
        last_checkpoint_step=m.last_checkpoint_step,
        npus=tuple(m.npus),
        restarts=m.restarts,
        steps_lost=m.steps_lost,
        step_s=m.step_s,
        started_ns=m.started_ns,
        last_failure_ns=m.last_failure_ns,
        last_restored_ns=m.last_restored_ns,
        goodput=m.goodput,
        failed_steps=m.failed_steps,
        last_corrupt_checkpoint_ns=m.last_corrupt_checkpoint_ns,
    )


def training_spec(job: TrainingSpec) -> training_pb2.TrainingSpec:
    return training_pb2.TrainingSpec(
        name=job.name,
        npus=job.npus,
        model=job.model,
        steps=job.steps,
        checkpoint_every=job.checkpoint_every,
        data_parallel=job.data_parallel,
        expert_parallel=job.expert_parallel,
        micro_batches=job.micro_batches,
    )
