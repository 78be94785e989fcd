"""What every device serves: the Device and UnifiedBus services over one DeviceState.

The kind-specific parts (an NPU's dies, a CPU's NUMA peers, a pool's members) live in their own
modules and are joined to this common part through the table in services/kinds.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from cmemu.v1 import device_pb2, device_pb2_grpc, ub_pb2, ub_pb2_grpc
from emulator.model.clock import Clock
from emulator.model.costmodel import ub_transfer_ns
from emulator.model.errors import (
    CapacityError,
    InvalidArgumentError,
    UnavailableError,
)
from emulator.model.hardware import HardwareProfile
from emulator.model.memory import DeviceMemory, Region
from emulator.model.topology import Device, DeviceKind, Topology
from services.eventsink import EventSink
from services.host import Register
from services.peers import Peers
from services.status import Context, rpc

MAX_LABEL = 256
MAX_WAIT_MS = 60_000

KIND_PROTO = {
    DeviceKind.NPU: device_pb2.DEVICE_KIND_NPU,
    DeviceKind.CPU: device_pb2.DEVICE_KIND_CPU,
    DeviceKind.MEMPOOL: device_pb2.DEVICE_KIND_MEMPOOL,
}


@dataclass
class Engine:
    """A compute engine (an NPU die) that runs kernels one after another in emulated time."""

    busy_until_ns: int = 0
    busy_ns: int = 0


@dataclass
class Counters:
    tx_count: int = 0
    tx_bytes: int = 0
    rx_count: int = 0
    rx_bytes: int = 0


@dataclass
class Fault:
    faulted: bool = False
    reason: str = ""
    since_ns: int = 0


@dataclass(kw_only=True)
class DeviceState:
    """Everything one device knows; shared by its servicers, owned by one event loop."""

    device: Device
    topology: Topology
    profile: HardwareProfile
    clock: Clock
    peers: Peers
    memory: DeviceMemory
    engines: list[Engine] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    fault: Fault = field(default_factory=Fault)
    inbox: asyncio.Queue[ub_pb2.UbMessage] = field(init=False)
    on_health: Callable[[bool], Awaitable[None]] | None = None
    events: EventSink | None = None

    def __post_init__(self) -> None:
        self.inbox = asyncio.Queue(maxsize=self.profile.limits.inbox_max_messages)
        self.log = structlog.get_logger("cmemu.device").bind(device=self.device.id)

    def require_healthy(self) -> None:
        if self.fault.faulted:
            raise UnavailableError(f"{self.device.id} is faulted: {self.fault.reason}")

    async def set_fault(self, faulted: bool, reason: str) -> None:
        changed = faulted != self.fault.faulted
        self.fault = Fault(
            faulted=faulted,
            reason=(reason or "injected") if faulted else "",
            since_ns=self.clock.now_ns() if changed else self.fault.since_ns,
        )
        if changed:
            self.log.warning("fault" if faulted else "recovered", reason=self.fault.reason)
            self.publish("fault" if faulted else "recovered", reason=self.fault.reason)
            self.publish("health", status="NOT_SERVING" if faulted else "SERVING")
            if self.on_health is not None:
                await self.on_health(not faulted)

    def telemetry(self) -> device_pb2.Telemetry:
        c = self.counters
        bus = self.events
        return device_pb2.Telemetry(
            device=self.device.id,
            emulated_ns=self.clock.now_ns(),
            memory_capacity_bytes=self.memory.capacity,
            memory_used_bytes=self.memory.allocator.used,
            stored_bytes=self.memory.store.stored_bytes,
            regions=len(self.memory.allocator.regions()),
            ub_tx_count=c.tx_count,
            ub_tx_bytes=c.tx_bytes,
            ub_rx_count=c.rx_count,
            ub_rx_bytes=c.rx_bytes,
            inbox_depth=self.inbox.qsize(),
            utilization=self.utilization(),
            faulted=self.fault.faulted,
            broker_connected=bus is not None and bus.connected,
            events_pending=bus.pending if bus is not None else 0,
            events_dropped=bus.dropped if bus is not None else 0,
        )

    def publish(self, event: str, **detail: Any) -> None:
        if self.events is not None:
            self.events.event(
                self.device.id, event, self.clock.now_ns(), kind=self.device.kind.value, **detail
            )

    def utilization(self) -> float:
        elapsed = self.clock.now_ns()
        if not self.engines or elapsed <= 0:
            return 0.0
        busy = sum(min(e.busy_ns, elapsed) for e in self.engines)
        return busy / (elapsed * len(self.engines))


def no_engines(profile: HardwareProfile) -> int:
    """For kinds that run no kernels."""
    return 0


def region_proto(state: DeviceState, region: Region) -> device_pb2.Region:
    return device_pb2.Region(
        region_id=region.region_id,
        eid=state.device.eid,
        offset=region.offset,
        size=region.size,
        label=region.label,
    )


HardwareInfo = Callable[[DeviceState, device_pb2.DeviceInfo], None]


@dataclass(frozen=True, kw_only=True)
class KindSpec:
    """How one device kind differs from the others; registered in services/kinds.py."""

    memory_bytes: Callable[[HardwareProfile], int]  # UB-addressable capacity at its EID
    engines: Callable[[HardwareProfile], int]  # compute engines that run kernels
    hardware: HardwareInfo  # fills DeviceInfo's hardware oneof
    services: Callable[[DeviceState], list[tuple[str, Register]]]  # its own gRPC services


class DeviceServicer(device_pb2_grpc.DeviceServicer):
    def __init__(self, state: DeviceState, hardware: HardwareInfo) -> None:
        self.state = state
        self._hardware = hardware

    @rpc
    async def GetInfo(
        self, request: device_pb2.GetInfoRequest, context: Context
    ) -> device_pb2.DeviceInfo:
        d = self.state.device
        info = device_pb2.DeviceInfo(
            id=d.id,
            kind=KIND_PROTO[d.kind],
            node=d.node,
            eid=d.eid,
            address=d.address,
            supernode=self.state.topology.supernode,
            memory_bytes=self.state.memory.capacity,
        )
        self._hardware(self.state, info)
        return info

    @rpc
    async def GetTelemetry(
        self, request: device_pb2.GetTelemetryRequest, context: Context
    ) -> device_pb2.Telemetry:
        return self.state.telemetry()

    @rpc
    async def AllocateRegion(
        self, request: device_pb2.AllocateRegionRequest, context: Context
    ) -> device_pb2.Region:
        self.state.require_healthy()
        if len(request.label) > MAX_LABEL:
            raise InvalidArgumentError(f"label longer than {MAX_LABEL} characters")
        region = self.state.memory.allocate(request.size, request.label)
        self.state.log.debug("allocated", region=region.region_id, size=region.size)
        return region_proto(self.state, region)

    @rpc
    async def FreeRegion(
        self, request: device_pb2.FreeRegionRequest, context: Context
    ) -> device_pb2.FreeRegionResponse:
        self.state.require_healthy()
        if request.region_id == 0:
            raise InvalidArgumentError("region_id is required")
        region = self.state.memory.free(request.region_id)
        return device_pb2.FreeRegionResponse(freed_bytes=region.size)

    @rpc
    async def ListRegions(
        self, request: device_pb2.ListRegionsRequest, context: Context
    ) -> device_pb2.ListRegionsResponse:
        alloc = self.state.memory.allocator
        return device_pb2.ListRegionsResponse(
            regions=[region_proto(self.state, r) for r in alloc.regions()],
            capacity_bytes=alloc.capacity,
            used_bytes=alloc.used,
            free_bytes=alloc.free,
            largest_free_bytes=alloc.largest_free,
        )

    @rpc
    async def GetFaultState(
        self, request: device_pb2.GetFaultStateRequest, context: Context
    ) -> device_pb2.FaultState:
        f = self.state.fault
        return device_pb2.FaultState(faulted=f.faulted, reason=f.reason, since_ns=f.since_ns)

    @rpc
    async def SetFaultState(
        self, request: device_pb2.FaultState, context: Context
    ) -> device_pb2.FaultState:
        if len(request.reason) > MAX_LABEL:
            raise InvalidArgumentError(f"reason longer than {MAX_LABEL} characters")
        await self.state.set_fault(request.faulted, request.reason)
        f = self.state.fault
        return device_pb2.FaultState(faulted=f.faulted, reason=f.reason, since_ns=f.since_ns)


# --- the unified bus -------------------------------------------------------------------------

CARRIES_PAYLOAD = {ub_pb2.UB_OP_WRITE, ub_pb2.UB_OP_SEND}
ATOMICS = {ub_pb2.UB_OP_CAS, ub_pb2.UB_OP_FETCH_ADD}
ATOMIC_BYTES = 8


def normalize(tx: ub_pb2.UbTransaction, inline_max: int) -> ub_pb2.UbTransaction:
    """Check a transaction's shape and fill `size` where it is implied; never touches state."""
    out = ub_pb2.UbTransaction()
    out.CopyFrom(tx)
    if out.op not in ub_pb2.UbOp.values() or out.op == ub_pb2.UB_OP_UNSPECIFIED:
        raise InvalidArgumentError(
            f"op must be one of READ, WRITE, CAS, FETCH_ADD, SEND; got {out.op}"
        )
    if out.dst.eid == 0:
        raise InvalidArgumentError("dst.eid is required")
    if out.op in ATOMICS:
        if out.data or out.size_only or out.size not in (0, ATOMIC_BYTES):
            raise InvalidArgumentError("atomics move exactly 8 bytes and carry no payload")
        out.size = ATOMIC_BYTES
        return out
    if out.data and out.op not in CARRIES_PAYLOAD:
        raise InvalidArgumentError("only WRITE and SEND carry data")
    if out.data and out.size_only:
        raise InvalidArgumentError("data and size_only are exclusive")
    if out.data:
        if out.size not in (0, len(out.data)):
            raise InvalidArgumentError(f"size {out.size} differs from len(data) {len(out.data)}")
        out.size = len(out.data)
    if out.size == 0:
        raise InvalidArgumentError("size must be > 0 (or data non-empty)")
    if out.op in CARRIES_PAYLOAD and not out.data and not out.size_only:
        raise InvalidArgumentError(
            "WRITE and SEND carry data, or set size_only for a bulk transfer"
        )
    if not out.size_only and out.size > inline_max:
        raise InvalidArgumentError(
            f"{out.size} bytes exceed the {inline_max}-byte inline payload limit; use size_only"
        )
    return out


class UnifiedBusServicer(ub_pb2_grpc.UnifiedBusServicer):
    def __init__(self, state: DeviceState) -> None:
        self.state = state
        self._apply: dict[
            int, Callable[[ub_pb2.UbTransaction, ub_pb2.UbCompletion], Awaitable[None]]
        ] = {
            ub_pb2.UB_OP_READ: self._read,
            ub_pb2.UB_OP_WRITE: self._write,
            ub_pb2.UB_OP_CAS: self._cas,
            ub_pb2.UB_OP_FETCH_ADD: self._fetch_add,
            ub_pb2.UB_OP_SEND: self._send,
        }

    @property
    def _inline_max(self) -> int:
        return self.state.profile.limits.inline_payload_max_bytes

    @rpc
    async def Submit(self, request: ub_pb2.UbTransaction, context: Context) -> ub_pb2.UbCompletion:
        """Issue a transaction from this device; the fabric times it and delivers it."""
        s = self.state
        s.require_healthy()
        tx = normalize(request, self._inline_max)
        target = s.topology.by_eid(tx.dst.eid)
        tx.src_eid = s.device.eid
        tx.issue_ns = s.clock.now_ns()
        tx.id = tx.id or uuid.uuid4().hex
        completion = await s.peers.transfer(tx, context.time_remaining())
        s.counters.tx_count += 1
        s.counters.tx_bytes += tx.size
        s.log.debug("ub submit", trace_id=tx.id, op=ub_pb2.UbOp.Name(tx.op), dst=target.id)
        return completion

    @rpc
    async def Deliver(self, request: ub_pb2.UbTransaction, context: Context) -> ub_pb2.UbCompletion:
        """Apply a transaction that arrives at this device."""
        return await self.deliver(request)

    async def deliver(self, request: ub_pb2.UbTransaction) -> ub_pb2.UbCompletion:
        """Deliver without gRPC: the fabric calls this directly when the device shares its
        process. The fabric then replaces the timing with its own; a direct caller of Deliver
        gets the uncontended cost model's timing."""
        s = self.state
        s.require_healthy()
        tx = normalize(request, self._inline_max)
        if tx.dst.eid != s.device.eid:
            raise InvalidArgumentError(
                f"dst.eid {tx.dst.eid} is not {s.device.id} ({s.device.eid})"
            )
        src = s.topology.by_eid(tx.src_eid) if tx.src_eid else s.device
        issue_ns = tx.issue_ns or s.clock.now_ns()
        duration = ub_transfer_ns(
            tx.size,
            src=src.kind,
            dst=s.device.kind,
            cross_node=src.node != s.device.node,
            profile=s.profile,
        )
        completion = ub_pb2.UbCompletion(
            id=tx.id,
            op=tx.op,
            src_eid=src.eid,
            dst_eid=s.device.eid,
            size=tx.size,
            issue_ns=issue_ns,
            complete_ns=issue_ns + duration,
            path=[src.id, s.device.id] if src is not s.device else [s.device.id],
        )
        await self._apply[tx.op](tx, completion)
        s.counters.rx_count += 1
        s.counters.rx_bytes += tx.size
        return completion

    async def _read(self, tx: ub_pb2.UbTransaction, out: ub_pb2.UbCompletion) -> None:
        memory = self.state.memory
        if tx.size_only:
            memory.check(tx.dst.offset, tx.size)
        else:
            out.data = memory.read(tx.dst.offset, tx.size)

    async def _write(self, tx: ub_pb2.UbTransaction, out: ub_pb2.UbCompletion) -> None:
        memory = self.state.memory
        if tx.size_only:
            memory.write_virtual(tx.dst.offset, tx.size)
        else:
            memory.write(tx.dst.offset, tx.data)

    async def _cas(self, tx: ub_pb2.UbTransaction, out: ub_pb2.UbCompletion) -> None:
        out.old_value, out.swapped = self.state.memory.compare_and_swap(
            tx.dst.offset, tx.compare, tx.operand
        )

    async def _fetch_add(self, tx: ub_pb2.UbTransaction, out: ub_pb2.UbCompletion) -> None:
        out.old_value = self.state.memory.fetch_add(tx.dst.offset, tx.operand)

    async def _send(self, tx: ub_pb2.UbTransaction, out: ub_pb2.UbCompletion) -> None:
        message = ub_pb2.UbMessage(
            id=tx.id,
            src_eid=out.src_eid,
            size=tx.size,
            data=tx.data,
            size_only=tx.size_only,
            issue_ns=out.issue_ns,
            arrive_ns=out.complete_ns,
        )
        try:
            self.state.inbox.put_nowait(message)
        except asyncio.QueueFull:
            raise CapacityError(
                f"receive queue of {self.state.device.id}", 1, 0, unit="messages"
            ) from None

    @rpc
    async def Receive(
        self, request: ub_pb2.ReceiveRequest, context: Context
    ) -> ub_pb2.ReceiveResponse:
        s = self.state
        s.require_healthy()
        limit = s.profile.limits.inbox_max_messages
        if request.max_messages > limit:
            raise InvalidArgumentError(f"max_messages must be <= {limit}")
        if request.wait_ms > MAX_WAIT_MS:
            raise InvalidArgumentError(f"wait_ms must be <= {MAX_WAIT_MS}")
        response = ub_pb2.ReceiveResponse()
        if s.inbox.empty() and request.wait_ms:
            try:
                async with asyncio.timeout(request.wait_ms / 1000):
                    response.messages.append(await s.inbox.get())
            except TimeoutError:
                return response
        while len(response.messages) < max(1, request.max_messages) and not s.inbox.empty():
            response.messages.append(s.inbox.get_nowait())
        return response
