"""The control plane's services as the cluster manager's engine calls them: the gRPC side of
the SchedulerPeer, RouterPeer and TrainingPeer protocols (emulator/engines/peers.py).

Each is for a manager in another process than the service's. In the same process the
service's engine answers directly, through its outage, so a killed or hung service looks the
same whichever launcher runs it: the scheduler's (emulator/engines/scheduler/local.py), the
router's (emulator/engines/serving/local.py), and the training jobs', which live on the
manager's own server (emulator/engines/training/). A failed call raises the EmulatorError its
status names, prefixed with the service's name, as emulator/client/remote.py's peers do.
"""

from __future__ import annotations

from typing import TypeVar

import grpc

from cmemu.emulator.client.status import reply_of
from cmemu.emulator.engines.peers import Marked
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.model.scheduler.jobs import Replacement
from cmemu.v1 import (
    router_pb2,
    router_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    training_pb2,
    training_pb2_grpc,
)

T = TypeVar("T")


def _marked(reply: scheduler_pb2.MarkResponse) -> Marked:
    return Marked(npus=tuple(reply.npus), affected_jobs=tuple(reply.affected_jobs))


class RemoteScheduler:
    """cmemu.v1.Scheduler: no deadline, as a controller waits for its scheduler to answer."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = scheduler_pb2_grpc.SchedulerStub(channel)

    async def mark_failed(self, npu: str) -> Marked:
        request = scheduler_pb2.MarkRequest(npu=npu)
        return _marked(await reply_of("scheduler", self._stub.MarkFailed(request)))

    async def mark_healthy(self, npu: str) -> Marked:
        request = scheduler_pb2.MarkRequest(npu=npu)
        return _marked(await reply_of("scheduler", self._stub.MarkHealthy(request)))

    async def replace(self, job: str, npu: str) -> tuple[Replacement, ...]:
        request = scheduler_pb2.ReplaceRequest(job=job, npu=npu)
        reply = await reply_of("scheduler", self._stub.Replace(request))
        return tuple(Replacement(old=r.old_npu, new=r.new_npu) for r in reply.replaced)


class RemoteRouter:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = router_pb2_grpc.RouterStub(channel)

    async def last_restored_ns(self, deployment: str) -> int:
        request = router_pb2.GetDeploymentRequest(name=deployment)
        reply = await reply_of("router", self._stub.GetDeployment(request))
        return int(reply.last_restored_ns)


class RemoteTraining:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = training_pb2_grpc.TrainingStub(channel)

    async def last_restored_ns(self, job: str) -> int | None:
        request = training_pb2.TrainingRequest(name=job)
        try:
            reply = await reply_of("training", self._stub.Get(request))
        except NotFoundError:
            return None
        return int(reply.last_restored_ns)
