"""Where the web view hears each device from: a `DeviceSource`, in the collector's terms (a device
id; a health name: SERVING, NOT_SERVING, UNREACHABLE, ...; its fault state and telemetry).

- `WireDevices`: as any client outside would: one grpc.health.v1 Watch stream per device (on a
  bare socket each, h2async.watch, unless TLS: then its grpc.aio channel), Device/GetFaultState
  and Device/GetTelemetry calls. What the view uses when the servers run in other processes
  (procs, compose, Kubernetes).
- `LocalDevices`: the servers' own state, read directly, when they run in this process (`cmemu
  up`'s default): their health as they set it (services/host.py `ServiceHost.watch_health`),
  their engines' fault state and telemetry; no socket, no HTTP/2 stream, no call per device.
  cm384's 624 Watch streams, opened together after the boot on the one event loop that also
  serves every device, held the first fabric transfers' replies 6-19% past their time, and the
  telemetry sweep's first calls opened a channel per NPU beside them (issue 18; its item 2: a
  peer in this process is called directly).

Both say the same thing of the same events: a server's health as it sets it (NOT_SERVING on a
fault, SERVING back), UNREACHABLE while no server answers (a crash, until the restart), and
nothing new for a hang (the gate holds new calls; a stream already open, like the view's,
hears no change) or a die down (a die's own health name, not the server's). A device whose
server would not answer a call (crashed, hung) gives no fault state or telemetry either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client import h2async
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.h2probe import ProbeError
from cmemu.emulator.client.health import UNREACHABLE, status_name
from cmemu.emulator.client.remote import RemoteDevice
from cmemu.emulator.client.status import error_from
from cmemu.emulator.engines.device.engine import DeviceEngine, FaultState, Telemetry
from cmemu.emulator.model.errors import DeadlineExceededError, EmulatorError, UnavailableError
from cmemu.services.kinds import DeviceServer

Heard = Callable[[str, str], None]
"""(device, health name): called on the event loop at each change (and once at the start)."""

LOCAL = "ok (in process)"  # the sources' "health" entry of each kind
WIRE = "ok (Watch streams)"


class DeviceSource(Protocol):
    """Each device's health as it changes, and what the view asks of a device, for the web
    view's collector."""

    @property
    def kind(self) -> str:
        """What the view's `sources` say of its health feed."""
        ...

    async def run(self, devices: Sequence[str], heard: Heard) -> None:
        """Tell `heard` each device's health at once and at every change, until cancelled."""
        ...

    async def fault_state(self, device: str, *, deadline_s: float) -> FaultState:
        """Why a device is out of service (EmulatorError when it cannot say)."""
        ...

    async def telemetry(self, device: str, *, deadline_s: float) -> Telemetry:
        """A device's telemetry (EmulatorError when it cannot say)."""
        ...


class LocalDevices:
    """Devices whose servers this process hosts, read from the servers and engines directly."""

    def __init__(self, servers: Mapping[str, DeviceServer]) -> None:
        self.servers = servers

    @property
    def kind(self) -> str:
        return LOCAL

    def covers(self, devices: Sequence[str]) -> bool:
        return all(d in self.servers for d in devices)

    async def run(self, devices: Sequence[str], heard: Heard) -> None:
        stops: list[Callable[[], None]] = []
        try:
            for device in devices:
                host = self.servers[device].host
                stops.append(host.watch_health(_named(device, heard)))
            await asyncio.Event().wait()  # until cancelled: the hosts call `heard`
        finally:
            for stop in stops:
                stop()

    async def fault_state(self, device: str, *, deadline_s: float) -> FaultState:
        return self._answering(device).fault_state()

    async def telemetry(self, device: str, *, deadline_s: float) -> Telemetry:
        return self._answering(device).telemetry()

    def _answering(self, device: str) -> DeviceEngine:
        """The device's engine, as a call to its server would find it: UNAVAILABLE while no
        server answers (crashed: a refused connection), DEADLINE_EXCEEDED while its gate holds
        calls (hung: at once, where a call would wait out its deadline)."""
        server = self.servers[device]
        if server.host.served is None:
            raise UnavailableError(f"{device} does not answer (its server is gone)", subject=device)
        if not server.host.gate.answering.is_set():
            raise DeadlineExceededError(f"{device} does not answer (hung)", subject=device)
        return server.engine


def _named(device: str, heard: Heard) -> Callable[[int | None], None]:
    def listener(status: int | None) -> None:
        heard(device, UNREACHABLE if status is None else status_name(status))

    return listener


class WireDevices:
    """Devices over the network: a Watch stream each (retried `retry_s` after it ends), calls."""

    def __init__(self, clients: Clients, *, retry_s: float = 1.0) -> None:
        self.clients = clients
        self.retry_s = retry_s

    @property
    def kind(self) -> str:
        return WIRE

    async def run(self, devices: Sequence[str], heard: Heard) -> None:
        async with asyncio.TaskGroup() as tasks:
            for device in devices:
                tasks.create_task(self._watching(device, heard), name=device)

    async def _watching(self, device: str, heard: Heard) -> None:
        """Watch one device for ever. A failure says UNREACHABLE (in _watch) and is retried
        after a pause; but not one that the view's close caused (grpc reports a call cancelled
        under it as CANCELLED, not as a cancellation): the close would wait for it for ever."""
        current = asyncio.current_task()
        while True:
            with contextlib.suppress(EmulatorError, OSError):
                await self._watch(device, heard)
            if current is not None and current.cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(self.retry_s)

    async def _watch(self, device: str, heard: Heard) -> None:
        """Plaintext devices are watched on a bare socket each (h2async.watch: no grpc.aio
        channel per device, cm384's 624 of them were 0.3-0.5 s of CPU and about 30 MB at every
        launch); TLS ones through their grpc.aio channel."""
        if self.clients.credentials.ca_pem is None:
            address = self.clients.find(device).address
            try:
                async with contextlib.aclosing(h2async.watch(address)) as statuses:
                    async for status in statuses:
                        heard(device, h2async.STATUS_NAMES.get(status, str(status)))
            except (OSError, ProbeError):
                heard(device, UNREACHABLE)
            return
        stub = health_pb2_grpc.HealthStub(self.clients.channel(device))
        try:
            async for reply in stub.Watch(health_pb2.HealthCheckRequest(service="")):
                heard(device, status_name(reply.status))
        except grpc.aio.AioRpcError as exc:
            heard(device, UNREACHABLE)
            raise error_from(exc) from None

    def _device(self, device: str) -> RemoteDevice:
        return RemoteDevice(self.clients.channel(device), self.clients.find(device))

    async def fault_state(self, device: str, *, deadline_s: float) -> FaultState:
        return await self._device(device).fault_state(deadline_s=deadline_s)

    async def telemetry(self, device: str, *, deadline_s: float) -> Telemetry:
        return await self._device(device).telemetry(deadline_s=deadline_s)
