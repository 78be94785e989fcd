"""A minimal controller of your own, in place of the reference cluster manager.

It uses only public APIs: it puts the reference manager in PASSIVE mode (it keeps recording
incidents, and acts on nothing), follows the liveness of the NPUs' processes (Device/
WatchLiveness: one stream per process, a beat every heartbeat interval of emulated time), and
for an NPU that is unreachable, down, or missing from `answering` for `misses` beats in a row
(a hang) it does what the reference one would: Scheduler/MarkFailed (isolation), then
Scheduler/Replace for every job holding it (a spare). The workloads restore themselves: they
watch their allocation (Scheduler/WatchAllocations). Beats come in emulated time, so a busy
host slows them down instead of making healthy NPUs look silent.

    cmemu up -d --preset cm-mini --time-scale 10
    python examples/minimal_controller.py            # Ctrl-C to stop
    cmemu fault add hang n00-npu3                    # in another terminal
"""

from __future__ import annotations

import asyncio

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.remote import RemoteDevice
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.runtime import state
from cmemu.v1 import manager_pb2, scheduler_pb2


async def control(clients: Clients, *, misses: int = 3, until: int = 0) -> dict[str, list[str]]:
    """Watch and act until `until` NPUs were replaced (0: forever); what it replaced: failed
    NPU -> its replacements."""
    await clients.manager().SetMode(
        manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
    )
    scheduler = clients.scheduler()
    npus = {d.id: d for d in clients.topology.devices if d.kind is DeviceKind.NPU}
    replaced: dict[str, list[str]] = {}
    silent: dict[str, int] = {}  # beats in a row an NPU was not answering
    done = asyncio.Event()

    async def isolate(npu: str) -> None:
        marked = await scheduler.MarkFailed(scheduler_pb2.MarkRequest(npu=npu))
        replaced[npu] = []
        for job in marked.affected_jobs:
            reply = await scheduler.Replace(scheduler_pb2.ReplaceRequest(job=job, npu=npu))
            replaced[npu] += [r.new_npu for r in reply.replaced]
        print(f"{npu} failed: isolated; jobs {list(marked.affected_jobs)} -> {replaced[npu]}")
        if until and len(replaced) >= until:
            done.set()

    async def follow(through: str, covered: set[str], opened: asyncio.Event) -> None:
        device = RemoteDevice(clients.channel(through), npus[through])
        async for beat in device.watch_liveness():
            covered.update(beat.covers)
            opened.set()
            for npu in (n for n in beat.covers if n in npus and n not in replaced):
                if npu in beat.unreachable or npu in beat.down:
                    await isolate(npu)
                elif npu in beat.answering:
                    silent[npu] = 0
                else:
                    silent[npu] = silent.get(npu, 0) + 1
                    if silent[npu] >= misses:
                        await isolate(npu)

    covered: set[str] = set()
    async with asyncio.TaskGroup() as tasks:
        streams = []
        for npu in npus:  # one stream per process: the first beat says what it covers
            if npu not in covered:
                opened = asyncio.Event()
                streams.append(tasks.create_task(follow(npu, covered, opened)))
                await opened.wait()
        await done.wait()
        for stream in streams:
            stream.cancel()
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
