"""Devices and services of other processes, as engines call them: the gRPC side of the peer
protocols of emulator/engines/peers.py. Each translates to the wire and back (emulator/client/
wire/) and turns a failed call into the EmulatorError its status names (emulator/client/
status.py), prefixed with the peer's id as a relayed status reads: the same errors a direct
call to an engine of the same process raises. The control plane's (the scheduler, the router,
the training jobs) are in emulator/client/control.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import grpc

from cmemu.emulator.client.channels import Channels
from cmemu.emulator.client.status import error_from, reply_of
from cmemu.emulator.client.wire import device as device_wire
from cmemu.emulator.client.wire import fabric as fabric_wire
from cmemu.emulator.client.wire import ub as ub_wire
from cmemu.emulator.engines.clock import ClockState
from cmemu.emulator.engines.device.engine import FaultState, Telemetry
from cmemu.emulator.engines.device.liveness import Beat
from cmemu.emulator.engines.device.npu import Kernel, KernelResult
from cmemu.emulator.engines.peers import CollectiveOutcome
from cmemu.emulator.model.arrivals import ArrivalBatch
from cmemu.emulator.model.collectivespec import CollectiveSpec
from cmemu.emulator.model.faults.fabric import FaultSpec
from cmemu.emulator.model.memory import Region, RegionPage
from cmemu.emulator.model.topology import Device
from cmemu.emulator.model.ub import Completion, Transaction
from cmemu.v1 import (
    device_pb2,
    device_pb2_grpc,
    fabric_pb2,
    fabric_pb2_grpc,
    npu_pb2_grpc,
    ub_pb2_grpc,
)

T = TypeVar("T")
FAULT_CALL_S = 10.0  # wall: a fault call answers at once


class RemoteDevice:
    def __init__(self, channel: grpc.aio.Channel, device: Device) -> None:
        self.device = device
        self._bus = ub_pb2_grpc.UnifiedBusStub(channel)
        self._device = device_pb2_grpc.DeviceStub(channel)
        self._npu = npu_pb2_grpc.NpuStub(channel)

    async def deliver(
        self, tx: Transaction, *, check_only: bool, deadline_s: float | None, timed: bool = False
    ) -> Completion:
        """(`timed` is the local bus's saving; a remote device prices what it delivers.)"""
        request = ub_wire.transaction_proto(tx, check_only=check_only)
        done = await reply_of(self.device.id, self._bus.Deliver(request, timeout=deadline_s))
        return ub_wire.completion(done)

    async def submit(self, tx: Transaction, *, deadline_s: float | None) -> Completion:
        request = ub_wire.transaction_proto(tx)
        done = await reply_of(self.device.id, self._bus.Submit(request, timeout=deadline_s))
        return ub_wire.completion(done)

    async def allocate(self, size: int, label: str, *, deadline_s: float | None) -> Region:
        request = device_pb2.AllocateRegionRequest(size=size, label=label)
        region = await reply_of(
            self.device.id, self._device.AllocateRegion(request, timeout=deadline_s)
        )
        return device_wire.region(region)

    async def free(self, region_id: int, *, deadline_s: float | None) -> int:
        request = device_pb2.FreeRegionRequest(region_id=region_id)
        freed = await reply_of(self.device.id, self._device.FreeRegion(request, timeout=deadline_s))
        return int(freed.freed_bytes)

    async def list_regions(self, page_token: str, *, deadline_s: float | None) -> RegionPage:
        request = device_pb2.ListRegionsRequest(page_token=page_token)
        page = await reply_of(self.device.id, self._device.ListRegions(request, timeout=deadline_s))
        return device_wire.region_page(page)

    async def fault_state(self, *, deadline_s: float | None) -> FaultState:
        request = device_pb2.GetFaultStateRequest()
        state = await reply_of(
            self.device.id, self._device.GetFaultState(request, timeout=deadline_s)
        )
        return device_wire.fault_state(state)

    async def telemetry(self, *, deadline_s: float | None) -> Telemetry:
        request = device_pb2.GetTelemetryRequest()
        seen = await reply_of(
            self.device.id, self._device.GetTelemetry(request, timeout=deadline_s)
        )
        return device_wire.telemetry(seen)

    async def kernel(self, kernel: Kernel, *, deadline_s: float | None) -> KernelResult:
        request = device_wire.kernel_proto(kernel)
        done = await reply_of(self.device.id, self._npu.SubmitKernel(request, timeout=deadline_s))
        return device_wire.kernel_result(done)

    async def watch_liveness(self) -> AsyncIterator[Beat]:
        stream = self._device.WatchLiveness(device_pb2.WatchLivenessRequest())
        try:
            async for beat in stream:
                yield device_wire.liveness(beat)
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc, self.device.id) from None
        finally:
            stream.cancel()


class ClockStream:
    """The owner of time, followed over a channel of its own that is opened anew for each
    stream. gRPC's DNS resolver backs off up to 120 s after failed lookups (not configurable),
    and a container cut off from its networks fails every lookup: a channel reused after a
    partition could wait two minutes to look the fabric up again, its process's time and
    heartbeats held meanwhile (the manager would keep it isolated). A new channel looks the
    name up at once; the old one is closed first (it carries nothing else)."""

    def __init__(self, channels: Channels, address: str) -> None:
        self._channels = channels
        self._address = address
        self._opened = False

    async def follow(
        self, process: str, wishes: AsyncIterator[tuple[float, float]]
    ) -> AsyncIterator[ClockState]:
        if self._opened:
            await self._channels.reset(self._address)
        self._opened = True
        source = RemoteFabric(self._channels.get(self._address))
        async for state in source.follow(process, wishes):
            yield state


class RemoteFabric:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = fabric_pb2_grpc.FabricStub(channel)

    async def transfer(self, tx: Transaction, *, deadline_s: float | None) -> Completion:
        request = ub_wire.transaction_proto(tx)
        done = await reply_of(None, self._stub.Transfer(request, timeout=deadline_s))
        return ub_wire.completion(done)

    async def collective(
        self,
        ranks: Sequence[str],
        spec: CollectiveSpec,
        *,
        detail: bool = False,
        deadline_s: float | None = None,
    ) -> CollectiveOutcome:
        request = fabric_wire.collective_request(list(ranks), spec, detail=detail)
        result = await reply_of("fabric", self._stub.Collective(request, timeout=deadline_s))
        return fabric_wire.collective_outcome(result)

    async def collective_arrivals(self, after_seq: int, *, limit: int = 0) -> ArrivalBatch:
        request = fabric_pb2.ListCollectiveArrivalsRequest(after_seq=after_seq, limit=limit)
        reply = await reply_of(
            "fabric", self._stub.ListCollectiveArrivals(request, timeout=FAULT_CALL_S)
        )
        return fabric_wire.arrival_batch(reply)

    async def link_fault(self, spec: FaultSpec[Any]) -> FaultSpec[Any]:
        request = fabric_wire.fault_proto(spec)
        stored = await reply_of("fabric", self._stub.InjectFault(request, timeout=FAULT_CALL_S))
        return fabric_wire.fault_spec(stored)

    async def clear_fault(self, fault_id: str) -> None:
        request = fabric_pb2.ClearFaultRequest(id=fault_id)
        await reply_of("fabric", self._stub.ClearFault(request, timeout=FAULT_CALL_S))

    async def follow(
        self, process: str, wishes: AsyncIterator[tuple[float, float]]
    ) -> AsyncIterator[ClockState]:
        async def reports() -> AsyncIterator[fabric_pb2.ClockReport]:
            yield fabric_pb2.ClockReport(process=process)  # names this process at once
            async for rate, lag_s in wishes:
                yield fabric_pb2.ClockReport(process=process, rate=rate, lag_s=lag_s)

        stream = self._stub.SyncClock(reports())
        try:
            async for segment in stream:
                yield fabric_wire.clock_state(segment)
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc, "fabric") from None
        finally:
            stream.cancel()
