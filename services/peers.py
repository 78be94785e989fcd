"""How one process reaches the devices and services of its topology.

It is the engines' Directory (emulator/engines/peers.py): a device or the fabric hosted in this
process is its engine, called directly (`LocalDevice`, `LocalFabric`: no serialising, one gRPC
call for a UB transaction: the client's); any other is the typed gRPC client
(emulator/client/remote.py) over one shared channel per address. Both raise the same errors.
It is the cluster manager's ControlPlane too: the scheduler and the router over gRPC (they have
no engine yet: emulator/client/control.py), the training jobs directly where this process hosts
them (the manager's), a server's health over gRPC.

`device_call`, `bus_call` and `channel` are the older way of the services not yet moved to the
engines layer (by method name, on protobufs); they go as those services move.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn, cast

import grpc

from cmemu.v1 import device_pb2_grpc, ub_pb2_grpc
from emulator.client import health
from emulator.client.channels import Channels
from emulator.client.control import RemoteRouter, RemoteScheduler, RemoteTraining
from emulator.client.credentials import ANONYMOUS, Credentials
from emulator.client.remote import ClockStream, RemoteDevice, RemoteFabric
from emulator.engines.device.engine import DeviceEngine
from emulator.engines.peers import (
    DevicePeer,
    FabricPeer,
    LocalDevice,
    LocalFabric,
    RouterPeer,
    SchedulerPeer,
    TrainingPeer,
)
from emulator.model.errors import EmulatorError
from emulator.model.topology import Device, ServiceKind, Topology
from services.rpc import Context, RemoteError, details_from_metadata

if TYPE_CHECKING:  # hosted in the fabric's process only (numpy): not every process imports it
    from emulator.engines.fabric.engine import FabricEngine


class LocalContext:
    """What a servicer method needs of its context when called in-process: no deadline, and an
    abort that raises the status for the caller instead of sending it."""

    def time_remaining(self) -> float | None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise RemoteError(code, details)

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        raise RemoteError(
            status.code, status.details, details_from_metadata(status.trailing_metadata)
        )


LOCAL_CONTEXT = cast(Context, LocalContext())


@asynccontextmanager
async def _deadline(deadline_s: float | None) -> AsyncIterator[None]:
    """An in-process call's deadline, ended as a gRPC call's would be (DEADLINE_EXCEEDED)."""
    if deadline_s is None:
        yield
        return
    try:
        async with asyncio.timeout(deadline_s):
            yield
    except TimeoutError:
        raise RemoteError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded") from None


class Peers:
    def __init__(self, topology: Topology, credentials: Credentials = ANONYMOUS) -> None:
        self.topology = topology
        self._channels = Channels(credentials)  # every device's calls carry the token
        self._clock_channels = Channels(credentials)
        self._local: dict[str, LocalDevice] = {}
        self._remote: dict[str, RemoteDevice] = {}
        self._local_fabric: LocalFabric | None = None
        self._remote_fabric: RemoteFabric | None = None
        self._training: TrainingPeer | None = None
        self._scheduler: RemoteScheduler | None = None
        self._router: RemoteRouter | None = None
        self._servicers: dict[str, dict[str, Any]] = {"device": {}, "bus": {}}

    # --- the engines' Directory ----------------------------------------------------------------

    def host_device(self, engine: DeviceEngine, servicers: Mapping[str, Any]) -> None:
        """A device engine of this process (and its servicers, for the older by-name calls)."""
        self._local[engine.device.address] = LocalDevice(engine)
        for role, servicer in servicers.items():
            self._servicers[role][engine.device.address] = servicer

    def host_fabric(self, engine: FabricEngine) -> None:
        self._local_fabric = LocalFabric(engine)

    def device(self, device: Device) -> DevicePeer:
        local = self._local.get(device.address)
        if local is not None:
            return local
        remote = self._remote.get(device.address)
        if remote is None:
            remote = self._remote[device.address] = RemoteDevice(
                self.channel(device.address), device
            )
        return remote

    async def forget(self, device: Device) -> None:
        if device.address in self._local:
            return
        self._remote.pop(device.address, None)
        await self._channels.reset(device.address)

    def fabric(self) -> FabricPeer:
        if self._local_fabric is not None:
            return self._local_fabric
        if self._remote_fabric is None:
            address = self.topology.service(ServiceKind.FABRIC).address
            self._remote_fabric = RemoteFabric(self.channel(address))
        return self._remote_fabric

    # --- the cluster manager's ControlPlane -----------------------------------------------------

    def host_training(self, training: TrainingPeer) -> None:
        """The training jobs of this process (the manager's server hosts them)."""
        self._training = training

    def scheduler(self) -> SchedulerPeer:
        if self._scheduler is None:
            self._scheduler = RemoteScheduler(self.channel(self._address(ServiceKind.SCHEDULER)))
        return self._scheduler

    def router(self) -> RouterPeer:
        if self._router is None:
            self._router = RemoteRouter(self.channel(self._address(ServiceKind.ROUTER)))
        return self._router

    def training(self) -> TrainingPeer:
        if self._training is not None:
            return self._training
        return RemoteTraining(self.channel(self._address(ServiceKind.MANAGER)))

    async def serving(self, address: str, *, deadline_s: float) -> bool:
        return await health.serving(self.channel(address), deadline_s)

    def _address(self, kind: ServiceKind) -> str:
        return self.topology.service(kind).address

    def clock_source(self, topology: Topology | None = None) -> ClockStream:
        """Where this process follows emulated time from: sn0's fabric (the first document's,
        or `topology`'s), on channels of the clock's own (ClockStream says why)."""
        address = (topology or self.topology).service(ServiceKind.FABRIC).address
        return ClockStream(self._clock_channels, address)

    # --- the older calls, by method name ---------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    async def device_call(
        self, device: Device, method: str, request: Any, deadline_s: float | None = 5.0
    ) -> Any:
        """A cmemu.v1.Device method of `device`: in-process directly, else over gRPC."""
        return await self._call(
            device,
            method,
            request,
            deadline_s,
            local=self._servicers["device"],
            stub=device_pb2_grpc.DeviceStub,
        )

    async def bus_call(
        self, device: Device, method: str, request: Any, deadline_s: float | None = None
    ) -> Any:
        """A cmemu.v1.UnifiedBus method of `device` (Submit, Receive)."""
        return await self._call(
            device,
            method,
            request,
            deadline_s,
            local=self._servicers["bus"],
            stub=ub_pb2_grpc.UnifiedBusStub,
        )

    async def _call(
        self,
        device: Device,
        method: str,
        request: Any,
        deadline_s: float | None,
        *,
        local: Mapping[str, Any],
        stub: Callable[[grpc.aio.Channel], Any],
    ) -> Any:
        servicer = local.get(device.address)
        try:
            if servicer is not None:
                async with _deadline(deadline_s):  # a hung device never answers
                    return await getattr(servicer, method)(request, LOCAL_CONTEXT)
            return await getattr(stub(self.channel(device.address)), method)(
                request, timeout=deadline_s
            )
        except RemoteError as exc:
            raise exc.prefixed(device.id) from exc
        except EmulatorError as exc:
            raise RemoteError.from_error(exc, device.id) from exc
        except grpc.aio.AioRpcError as exc:
            raise RemoteError.from_rpc_error(exc, device.id) from exc

    async def close(self) -> None:
        await self._channels.close()
        await self._clock_channels.close()
