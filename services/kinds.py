"""The table of device kinds, and the one function that serves a device's engine on its own
gRPC server (Device, UnifiedBus and the kind's own services, health, reflection)."""

from __future__ import annotations

import asyncio
import contextlib

from cmemu.emulator.engines.device.engine import DeviceEngine, die_name
from cmemu.emulator.model.topology import DeviceKind
from cmemu.services import cpu, mempool, npu
from cmemu.services.device import DeviceServicer
from cmemu.services.host import NOT_SERVING, SERVING, ServiceHost
from cmemu.services.kindspec import KindSpec
from cmemu.services.rpc import Context
from cmemu.services.ub import UnifiedBusServicer
from cmemu.v1 import device_pb2_grpc, ub_pb2_grpc

KINDS: dict[DeviceKind, KindSpec] = {
    DeviceKind.NPU: npu.KIND,
    DeviceKind.CPU: cpu.KIND,
    DeviceKind.MEMPOOL: mempool.KIND,
}

DEVICE_SERVICE = "cmemu.v1.Device"
UB_SERVICE = "cmemu.v1.UnifiedBus"
# A device crashing itself answers first, then its server stops: once that call has ended (its
# status handed to the transport) and this much later, for the transport to write it out; a call
# whose end never comes (a client gone) holds the stop at most SELF_STOP_WAIT_S. A fixed delay
# alone (50 ms) was cut short on a busy host: the answer was lost with the server.
SELF_STOP_DELAY_S = 0.05
SELF_STOP_WAIT_S = 5.0


class DeviceServer:
    """A device's gRPC server, as its engine sees it (emulator/engines/device/engine.py
    `Server`): health, a die's health, a crash's stop and the restart after it."""

    def __init__(self, engine: DeviceEngine) -> None:
        kind = KINDS[engine.device.kind]
        device = DeviceServicer(engine, kind.hardware, self.answer_first)
        bus = UnifiedBusServicer(engine)
        self.engine = engine
        self.host = ServiceHost(
            name=engine.device.id,
            address=engine.device.address,
            services=[
                (DEVICE_SERVICE, lambda s: device_pb2_grpc.add_DeviceServicer_to_server(device, s)),
                (UB_SERVICE, lambda s: ub_pb2_grpc.add_UnifiedBusServicer_to_server(bus, s)),
                *kind.services(engine),
            ],
        )
        self.host.gate.answering = engine.effects.answering  # a hang closes the gate
        self.host.extra_health = [die_name(engine.device.id, d) for d in range(engine.dies.count)]
        self._stops: set[asyncio.Task[None]] = set()
        self._answer: asyncio.Event | None = None  # the end of the call a self-stop waits for
        engine.server = self

    async def start(self) -> None:
        await self.host.start()
        await self.engine.show_health()

    async def set_serving(self, serving: bool) -> None:
        await self.host.set_serving(serving)

    async def set_part(self, name: str, serving: bool) -> None:
        await self.host.health.set(name, SERVING if serving else NOT_SERVING)

    def answer_first(self, context: Context) -> None:
        """`context`'s call may stop this server (a crash told to the device itself): a stop
        it causes waits for the call to end."""
        answer = self._answer = asyncio.Event()
        # grpc-stubs declare the callback a class; grpc takes any callable of the context
        context.add_done_callback(lambda _: answer.set())  # type: ignore[arg-type]

    async def stop(self, *, deferred: bool) -> None:
        """The server gone, its port free. A device that stops itself answers first."""
        if deferred:
            answer, self._answer = self._answer, None
            task = asyncio.get_running_loop().create_task(self._stop_later(answer))
            self._stops.add(task)
            task.add_done_callback(self._stops.discard)
        else:
            await self.host.stop_server(0)

    async def _stop_later(self, answer: asyncio.Event | None) -> None:
        if answer is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SELF_STOP_WAIT_S):
                    await answer.wait()
        await asyncio.sleep(SELF_STOP_DELAY_S)
        await self.host.stop_server(0)

    async def restart(self) -> None:
        for task in list(self._stops):  # a self-crash's deferred stop, still pending, would
            task.cancel()  # stop the new server
        with contextlib.suppress(Exception):
            await self.host.stop_server(0)
        self.host.secure(self.host.security)  # a stopped grpc server cannot start again
        await self.host.start()

    def close(self) -> None:
        for task in list(self._stops):
            task.cancel()
