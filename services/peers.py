"""How one process reaches the devices and services of its topology.

Calls go over gRPC, one shared channel per address whatever the number of callers, except to
servers that live in this same process: those are called directly, which takes the loopback
gRPC hops out of the in-process supernode's UB path (a device's Submit reaches the fabric and the
fabric reaches the target without serialising anything) while every client outside the process
still speaks gRPC. Both paths raise the same errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, NoReturn, Protocol, cast

import grpc

from cmemu.v1 import device_pb2_grpc, fabric_pb2_grpc, ub_pb2, ub_pb2_grpc
from emulator.client.channels import Channels
from emulator.client.credentials import ANONYMOUS, Credentials
from emulator.model.errors import EmulatorError
from emulator.model.hardware import EmulatorLimits
from emulator.model.memory import QueueBudget, StoreBudget
from emulator.model.topology import Device, ServiceKind, Topology
from services.status import Context, RemoteError, details_from_metadata


class LocalBus(Protocol):
    async def deliver(self, request: ub_pb2.UbTransaction) -> ub_pb2.UbCompletion: ...


class LocalFabric(Protocol):
    async def transfer(
        self, request: ub_pb2.UbTransaction, deadline_s: float | None
    ) -> ub_pb2.UbCompletion: ...


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
async def _deadline(device: Device, deadline_s: float | None) -> AsyncIterator[None]:
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
        self._local_bus: dict[str, LocalBus] = {}
        self._local_device: dict[str, Any] = {}
        self._local_fabric: LocalFabric | None = None
        self._budgets: tuple[StoreBudget, QueueBudget] | None = None

    def budgets(self, limits: EmulatorLimits) -> tuple[StoreBudget, QueueBudget]:
        """The caps every device of this process shares (one Peers per process): real bytes
        stored, and messages queued. Made by the first device, with its limits."""
        if self._budgets is None:
            self._budgets = (
                StoreBudget(cap_bytes=limits.process_stored_bytes_cap),
                QueueBudget(
                    max_messages=limits.process_inbox_max_messages,
                    max_bytes=limits.process_inbox_max_bytes,
                ),
            )
        return self._budgets

    def register_bus(self, address: str, bus: LocalBus) -> None:
        self._local_bus[address] = bus

    def register_device(self, address: str, servicer: Any) -> None:
        self._local_device[address] = servicer

    def register_fabric(self, fabric: LocalFabric) -> None:
        self._local_fabric = fabric

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.get(address)

    def bus(self, device: Device) -> ub_pb2_grpc.UnifiedBusAsyncStub:
        return ub_pb2_grpc.UnifiedBusStub(self.channel(device.address))

    def fabric(self) -> fabric_pb2_grpc.FabricAsyncStub:
        return fabric_pb2_grpc.FabricStub(
            self.channel(self.topology.service(ServiceKind.FABRIC).address)
        )

    async def deliver(
        self, device: Device, tx: ub_pb2.UbTransaction, deadline_s: float | None
    ) -> ub_pb2.UbCompletion:
        """Have `device` apply a transaction; its refusal comes back as its status."""
        local = self._local_bus.get(device.address)
        try:
            if local is not None:
                async with _deadline(device, deadline_s):  # a hung device never answers
                    return await local.deliver(tx)
            completion: ub_pb2.UbCompletion = await self.bus(device).Deliver(tx, timeout=deadline_s)
            return completion
        except EmulatorError as exc:
            raise RemoteError.from_error(exc, device.id) from exc
        except grpc.aio.AioRpcError as exc:
            raise RemoteError.from_rpc_error(exc, device.id) from exc

    async def transfer(
        self, tx: ub_pb2.UbTransaction, deadline_s: float | None
    ) -> ub_pb2.UbCompletion:
        """Hand a transaction to the fabric."""
        if self._local_fabric is not None:
            return await self._local_fabric.transfer(tx, deadline_s)
        try:
            completion: ub_pb2.UbCompletion = await self.fabric().Transfer(tx, timeout=deadline_s)
            return completion
        except grpc.aio.AioRpcError as exc:
            raise RemoteError.from_rpc_error(exc, None) from exc

    async def device_call(
        self, device: Device, method: str, request: Any, deadline_s: float | None = 5.0
    ) -> Any:
        """A cmemu.v1.Device method of `device`: in-process directly, else over gRPC."""
        return await self._call(
            device,
            method,
            request,
            deadline_s,
            local=self._local_device,
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
            local=self._local_bus,
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
                async with _deadline(device, deadline_s):  # a hung device never answers
                    return await getattr(servicer, method)(request, LOCAL_CONTEXT)
            return await getattr(stub(self.channel(device.address)), method)(
                request, timeout=deadline_s
            )
        except RemoteError as exc:
            raise exc.prefixed(device.id) from exc
        except grpc.aio.AioRpcError as exc:
            raise RemoteError.from_rpc_error(exc, device.id) from exc

    async def close(self) -> None:
        await self._channels.close()
