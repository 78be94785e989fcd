"""The Device service every device serves, over its engine (emulator/engines/device/).

Each method translates its request into a call on the engine and the answer back; errors become
statuses in the `rpc` decorator. The kind-specific services (an NPU's kernels, a CPU's NUMA
peers, a pool's members) and the unified bus are in their own modules, joined in
services/kinds.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from cmemu.emulator.client.wire import device as wire
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.engines.device.engine import MAX_LABEL, DeviceEngine
from cmemu.emulator.engines.device.faults import DEVICE_DOWN
from cmemu.emulator.engines.device.kinds import PARAMS as DEVICE_PARAMS
from cmemu.emulator.model.errors import InvalidArgumentError, PreconditionError
from cmemu.emulator.model.topology import DeviceKind
from cmemu.services.rpc import Context, abort, rpc
from cmemu.v1 import device_pb2, device_pb2_grpc

KIND_PROTO = {
    DeviceKind.NPU: device_pb2.DEVICE_KIND_NPU,
    DeviceKind.CPU: device_pb2.DEVICE_KIND_CPU,
    DeviceKind.MEMPOOL: device_pb2.DEVICE_KIND_MEMPOOL,
}

HardwareInfo = Callable[[DeviceEngine, device_pb2.DeviceInfo], None]


class DeviceServicer(device_pb2_grpc.DeviceServicer):
    def __init__(
        self,
        engine: DeviceEngine,
        hardware: HardwareInfo,
        answer_first: Callable[[Context], None] | None = None,
    ) -> None:
        self.engine = engine
        self._hardware = hardware
        # a fault this device's own server takes (a crash stops that server): the server's stop
        # waits for this call's answer to be sent (services/kinds.py DeviceServer.answer_first)
        self._answer_first = answer_first

    @rpc
    async def GetInfo(
        self, request: device_pb2.GetInfoRequest, context: Context
    ) -> device_pb2.DeviceInfo:
        e = self.engine
        d = e.device
        info = device_pb2.DeviceInfo(
            id=d.id,
            kind=KIND_PROTO[d.kind],
            node=d.node,
            eid=d.eid,
            address=d.address,
            supernode=e.topology.supernode,
            memory_bytes=e.memory.capacity,
        )
        self._hardware(e, info)
        return info

    @rpc
    async def GetTelemetry(
        self, request: device_pb2.GetTelemetryRequest, context: Context
    ) -> device_pb2.Telemetry:
        return wire.telemetry_proto(self.engine.telemetry())

    @rpc
    async def AllocateRegion(
        self, request: device_pb2.AllocateRegionRequest, context: Context
    ) -> device_pb2.Region:
        region = self.engine.allocate(request.size, request.label)
        return wire.region_proto(region, self.engine.device.eid)

    @rpc
    async def FreeRegion(
        self, request: device_pb2.FreeRegionRequest, context: Context
    ) -> device_pb2.FreeRegionResponse:
        if request.region_id == 0:
            raise InvalidArgumentError("region_id is required", field="region_id")
        return device_pb2.FreeRegionResponse(freed_bytes=self.engine.free(request.region_id))

    @rpc
    async def ListRegions(
        self, request: device_pb2.ListRegionsRequest, context: Context
    ) -> device_pb2.ListRegionsResponse:
        page = self.engine.region_page(request.page_token, request.page_size)
        return wire.region_page_proto(page, self.engine.device.eid)

    @rpc
    async def GetFaultState(
        self, request: device_pb2.GetFaultStateRequest, context: Context
    ) -> device_pb2.FaultState:
        return wire.fault_state_proto(self.engine.fault_state())

    @rpc
    async def SetFaultState(
        self, request: device_pb2.FaultState, context: Context
    ) -> device_pb2.FaultState:
        if len(request.reason) > MAX_LABEL:
            raise InvalidArgumentError(f"reason longer than {MAX_LABEL} characters", field="reason")
        await self.engine.set_fault(request.faulted, request.reason)
        if not request.faulted:
            self.engine.faults.forget(DEVICE_DOWN)
        return wire.fault_state_proto(self.engine.fault)

    @rpc
    async def InjectFault(
        self, request: device_pb2.FaultState, context: Context
    ) -> device_pb2.FaultState:
        target = self.engine.faults.target(request.device)
        by_itself = target is self.engine
        if by_itself and self._answer_first is not None:
            self._answer_first(context)
        fault = await target.faults.inject(
            request.kind,
            faultparams.unpack(request, DEVICE_PARAMS),
            request.for_s,
            by_itself=by_itself,
        )
        return wire.active_fault_proto(fault, target.device.id)

    @rpc
    async def ClearFault(
        self, request: device_pb2.ClearDeviceFaultRequest, context: Context
    ) -> device_pb2.FaultState:
        if not request.kind:
            raise InvalidArgumentError("kind is required", field="kind")
        target = self.engine.faults.target(request.device)
        fault = await target.faults.clear(request.kind)
        if fault is None:  # a device-down set by SetFaultState
            return device_pb2.FaultState(
                faulted=False,
                kind=DEVICE_DOWN,
                device=target.device.id,
                since_ns=target.fault.since_ns,
            )
        return wire.active_fault_proto(fault, target.device.id, faulted=False)

    @rpc
    async def ListFaults(
        self, request: device_pb2.ListDeviceFaultsRequest, context: Context
    ) -> device_pb2.DeviceFaultList:
        e = self.engine
        engines = e.faults.siblings.values() if request.process else [e]
        return device_pb2.DeviceFaultList(
            faults=[
                wire.active_fault_proto(f, x.device.id) for x in engines for f in x.faults.listed()
            ],
            hosted=[x.device.id for x in engines],
        )

    async def WatchLiveness(
        self, request: device_pb2.WatchLivenessRequest, context: Context
    ) -> AsyncIterator[device_pb2.Liveness]:
        """The liveness of this device's process (the cluster manager's detection)."""
        liveness = self.engine.liveness
        if liveness is None:
            await abort(
                context,
                PreconditionError(
                    f"{self.engine.device.id}'s process keeps no liveness", reason="NO_LIVENESS"
                ),
            )
            return
        async for beat in liveness.watch():
            yield wire.liveness_proto(beat)
