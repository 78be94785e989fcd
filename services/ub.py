"""The UnifiedBus service every device serves: its engine's bus (emulator/engines/device/ub.py)
behind the wire."""

from __future__ import annotations

from cmemu.emulator.client.wire import ub as wire
from cmemu.emulator.engines.device.engine import DeviceEngine
from cmemu.services.rpc import Context, rpc
from cmemu.v1 import ub_pb2, ub_pb2_grpc


class UnifiedBusServicer(ub_pb2_grpc.UnifiedBusServicer):
    def __init__(self, engine: DeviceEngine) -> None:
        self.engine = engine

    @rpc
    async def Submit(self, request: ub_pb2.UbTransaction, context: Context) -> ub_pb2.UbCompletion:
        """Issue a transaction from this device; the fabric times it and delivers it."""
        done = await self.engine.bus.submit(wire.transaction(request), context.time_remaining())
        return wire.completion_proto(done)

    @rpc
    async def Deliver(self, request: ub_pb2.UbTransaction, context: Context) -> ub_pb2.UbCompletion:
        """Apply a transaction that arrives at this device."""
        done = self.engine.bus.deliver(wire.transaction(request), check_only=request.check_only)
        return wire.completion_proto(done)

    @rpc
    async def Receive(
        self, request: ub_pb2.ReceiveRequest, context: Context
    ) -> ub_pb2.ReceiveResponse:
        messages = await self.engine.bus.receive(request.max_messages, request.wait_ms)
        return ub_pb2.ReceiveResponse(messages=[wire.message_proto(m) for m in messages])
