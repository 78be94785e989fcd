"""cmemu.v1.Training: start, list, get and stop training jobs, translated to and from the
training engine (emulator/engines/training/), which holds the jobs; a refusal is the engine's
EmulatorError, mapped to its status by `rpc`."""

from __future__ import annotations

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.training.engine import TrainingEngine
from cmemu.emulator.engines.training.live import Endpoints, LiveJob
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.model.training.spec import TrainingSpec
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, rpc
from cmemu.v1 import training_pb2, training_pb2_grpc

SERVICE = "cmemu.v1.Training"


def create_training(
    *,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    events: EventSink | None,
    topic: str,
) -> TrainingEngine:
    """The engine, its jobs reaching the scheduler, EMS and the fabric through `peers`: their
    engines when this process hosts them, else their typed clients over the shared channels."""
    endpoints = Endpoints(
        scheduler=peers.job_scheduler(), ems=peers.kv_store(), fabric=peers.fabric
    )
    return TrainingEngine(
        profile=profile, clock=clock, endpoints=endpoints, events=events, topic=topic
    )


def spec_of(m: training_pb2.TrainingSpec) -> TrainingSpec:
    return TrainingSpec(
        name=m.name,
        npus=m.npus,
        model=m.model,
        steps=m.steps,
        checkpoint_every=m.checkpoint_every,
        data_parallel=m.data_parallel,
        expert_parallel=m.expert_parallel,
        micro_batches=m.micro_batches,
    )


def job_message(job: LiveJob, now_ns: int) -> training_pb2.TrainingJob:
    p = job.progress
    return training_pb2.TrainingJob(
        name=p.name,
        state=p.state,
        step=p.step,
        last_checkpoint_step=p.last_checkpoint_step,
        npus=[n.id for n in job.allocation.npus],
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


class TrainingServicer(training_pb2_grpc.TrainingServicer):
    def __init__(self, engine: TrainingEngine) -> None:
        self.engine = engine

    def _message(self, job: LiveJob) -> training_pb2.TrainingJob:
        return job_message(job, self.engine.clock.now_ns())

    @rpc
    async def Start(
        self, request: training_pb2.StartTrainingRequest, context: Context
    ) -> training_pb2.TrainingJob:
        job = await self.engine.start(spec_of(request.spec), resume=request.spec.resume)
        return self._message(job)

    @rpc
    async def Get(
        self, request: training_pb2.TrainingRequest, context: Context
    ) -> training_pb2.TrainingJob:
        return self._message(self.engine.get(request.name))

    @rpc
    async def List(
        self, request: training_pb2.ListTrainingRequest, context: Context
    ) -> training_pb2.TrainingList:
        now = self.engine.clock.now_ns()
        return training_pb2.TrainingList(
            jobs=[job_message(j, now) for j in self.engine.jobs.values()]
        )

    @rpc
    async def Stop(
        self, request: training_pb2.TrainingRequest, context: Context
    ) -> training_pb2.TrainingJob:
        job = await self.engine.stop(request.name, checkpoint=request.checkpoint)
        return self._message(job)
