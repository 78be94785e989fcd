"""A minimal controller of your own, in place of the reference cluster manager.

It uses only public APIs: it puts the reference manager in PASSIVE mode (it keeps recording
incidents, and acts on nothing), health-checks every NPU each round with a deadline, and for an
NPU that does not answer SERVING it does what the reference one would: Scheduler/MarkFailed
(isolation), then Scheduler/Replace for every job holding it (a spare). The workloads restore
themselves: they watch their allocation (Scheduler/WatchAllocations).

    cmemu up -d --preset cm-mini --time-scale 10
    python examples/minimal_controller.py            # Ctrl-C to stop
    cmemu fault add hang n00-npu3                    # in another terminal
"""

from __future__ import annotations

import asyncio

import grpc

from cmemu.v1 import manager_pb2, scheduler_pb2
from emulator.client import health
from emulator.client.clients import Clients
from emulator.model.topology import DeviceKind
from emulator.runtime import state


async def serving(clients: Clients, npu: str, deadline_s: float) -> bool:
    try:
        return await health.check(clients.channel(npu), timeout_s=deadline_s) == "SERVING"
    except grpc.aio.AioRpcError:  # hung (DEADLINE_EXCEEDED) or gone (UNAVAILABLE)
        return False


async def control(
    clients: Clients, *, period_s: float = 0.5, deadline_s: float = 0.5, rounds: int = 0
) -> dict[str, list[str]]:
    """Run `rounds` rounds (0: forever); what it replaced: failed NPU -> its replacements."""
    await clients.manager().SetMode(
        manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
    )
    scheduler = clients.scheduler()
    npus = [d.id for d in clients.topology.devices if d.kind is DeviceKind.NPU]
    replaced: dict[str, list[str]] = {}
    done = 0
    while not rounds or done < rounds:
        answers = await asyncio.gather(*(serving(clients, n, deadline_s) for n in npus))
        for npu, ok in zip(npus, answers, strict=True):
            if ok or npu in replaced:
                continue
            marked = await scheduler.MarkFailed(scheduler_pb2.MarkRequest(npu=npu))
            replaced[npu] = []
            for job in marked.affected_jobs:
                reply = await scheduler.Replace(scheduler_pb2.ReplaceRequest(job=job, npu=npu))
                replaced[npu] += [r.new_npu for r in reply.replaced]
            print(f"{npu} failed: isolated; jobs {list(marked.affected_jobs)} -> {replaced[npu]}")
        done += 1
        await asyncio.sleep(period_s)
    return replaced


async def main() -> None:
    path = state.path_from(None)
    clients = Clients(state.read(path), state.credentials(path))
    try:
        await control(clients)
    finally:
        await clients.close()


if __name__ == "__main__":
    asyncio.run(main())
