"""What every device serves: the Device service over one DeviceState (the UnifiedBus service
over the same state is in services/ub.py).

The kind-specific parts (an NPU's dies, a CPU's NUMA peers, a pool's members) live in their own
modules and are joined to this common part through the table in services/kinds.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from cmemu.v1 import device_pb2, device_pb2_grpc, ub_pb2
from emulator.model.clock import Clock
from emulator.model.errors import (
    RETRY_AFTER_S,
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    blame,
    quote,
)
from emulator.model.faults.memory import Poison
from emulator.model.hardware import HardwareProfile
from emulator.model.instruments import Histogram
from emulator.model.memory import DeviceMemory, QueueBudget, Region
from emulator.model.topology import Device, DeviceKind, Topology
from services import devicefaults
from services.eventsink import EventSink
from services.host import DEVICE_MANAGEMENT, Register
from services.peers import Peers
from services.status import Context, rpc

MAX_LABEL = 256
U64_MAX = 2**64 - 1

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
    faults: int = 0  # times the device went down


@dataclass
class Latencies:
    """Emulated latency, issue to completion, of what this device issued: UB transactions by op
    (lower-case, as the metrics label them) and kernels (queueing included). Counted here, on
    the path, because no state holds them afterwards; read by the metrics collector."""

    ub: dict[str, Histogram] = field(default_factory=dict)
    kernel: Histogram = field(default_factory=Histogram)

    def ub_op(self, op: str, seconds: float) -> None:
        histogram = self.ub.get(op)
        if histogram is None:
            histogram = self.ub[op] = Histogram()
        histogram.observe(seconds)


@dataclass
class Fault:
    faulted: bool = False
    reason: str = ""
    since_ns: int = 0


MANAGEMENT = DEVICE_MANAGEMENT
"""Device methods that model the out-of-band management path (a BMC): they keep answering
when the device hangs, so that a hang can be cleared, and answer for a crashed sibling."""


@dataclass
class Effects:
    """What the catalogue's active faults do to the device (services/devicefaults.py sets
    them): read on the hot paths, so plain fields, not a lookup per call."""

    crashed: bool = False
    answering: asyncio.Event = field(default_factory=asyncio.Event)  # cleared: hung
    compute_share: float = 1.0
    dies_down: set[int] = field(default_factory=set)
    poison: Poison = field(default_factory=Poison)
    errors: int = 0  # calls refused because of a fault

    def __post_init__(self) -> None:
        self.answering.set()


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
    latency: Latencies = field(default_factory=Latencies)
    fault: Fault = field(default_factory=Fault)
    effects: Effects = field(default_factory=Effects)
    catalogue: dict[str, Any] = field(default_factory=dict)  # kind -> devicefaults.Active
    fault_host: Any = None  # devicefaults.FaultHost: its server and its process's siblings
    inbox: asyncio.Queue[ub_pb2.UbMessage] = field(init=False)
    on_health: Callable[[bool], Awaitable[None]] | None = None
    events: EventSink | None = None
    queue_budget: QueueBudget | None = None  # the process's cap on queued messages

    def __post_init__(self) -> None:
        self.inbox = asyncio.Queue(maxsize=self.profile.limits.inbox_max_messages)
        self.log = structlog.get_logger("cmemu.device").bind(device=self.device.id)

    def require_healthy(self) -> None:
        if self.effects.crashed:
            self.effects.errors += 1
            raise self.unreachable()
        if self.fault.faulted:
            self.effects.errors += 1
            raise UnavailableError(
                f"{self.device.id} is faulted: {self.fault.reason}",
                subject=self.device.id,
                reason="DEVICE_FAULTED",
                retry_after_s=RETRY_AFTER_S,
            )

    @property
    def silent(self) -> bool:
        """Crashed or hung: the device sends no telemetry."""
        return self.effects.crashed or not self.effects.answering.is_set()

    def unreachable(self) -> UnavailableError:
        """What a caller in this process gets from a crashed device: what a gRPC client gets
        from its closed port (services/status.py RemoteError.from_rpc_error)."""
        return UnavailableError(
            f"{self.device.id} is unreachable (crashed)",
            subject=self.device.id,
            reason="PEER_UNREACHABLE",
            retry_after_s=RETRY_AFTER_S,
        )

    async def admit(self, method: str) -> None:
        """Every call's gate (services/status.py `rpc`, and the fabric's direct delivery): a
        crashed device refuses everything, a hung one never answers, until its fault clears;
        a hung device's fault-control methods still answer."""
        if self.effects.crashed:  # its own servicer is gone; its siblings answer for it
            self.effects.errors += 1
            raise self.unreachable()
        if method in MANAGEMENT:
            return
        if not self.effects.answering.is_set():
            await self.effects.answering.wait()

    def require_die(self, die: int) -> None:
        if die in self.effects.dies_down:
            self.effects.errors += 1
            raise UnavailableError(
                f"die {die} of {self.device.id} is down",
                field="die",
                subject=f"{self.device.id}.d{die}",
                reason="DIE_DOWN",
                retry_after_s=RETRY_AFTER_S,
            )

    def require_address(self, offset: int, size: int) -> None:
        """Refuse an access to a down die's HBM half (NPU), or that reads poisoned bytes."""
        if self.effects.dies_down and self.engines:
            per_die = self.profile.npu.hbm_bytes_per_die
            last = max(offset + max(size, 1) - 1, offset)
            for die in range(offset // per_die, last // per_die + 1):
                self.require_die(die)

    def require_unpoisoned(self, offset: int, size: int) -> None:
        poison = self.effects.poison
        if not poison.ranges:
            return
        hit = poison.hit(offset, size)
        if hit is not None:
            poison.reads_refused += 1
            self.effects.errors += 1
            self.publish("ecc", offset=offset, size=size, poisoned_offset=hit[0])
            raise DataLossError(
                f"uncorrectable ECC error in [{hit[0]}, {hit[1]}) of {self.device.id}: "
                "the bytes are lost; rewrite them to heal",
                field="dst.offset",
                subject=self.device.id,
                reason="HBM_UNCORRECTABLE_ECC",
            )

    async def set_fault(self, faulted: bool, reason: str, *, announce: bool = True) -> None:
        """Down or up (device-down). `announce=False`: the caller (the catalogue's
        device-down, services/devicefaults.py) publishes the fault events itself."""
        changed = faulted != self.fault.faulted
        self.fault = Fault(
            faulted=faulted,
            reason=(reason or "injected") if faulted else "",
            since_ns=self.clock.now_ns() if changed else self.fault.since_ns,
        )
        if changed:
            self.counters.faults += int(faulted)
            if announce:
                self.log.warning("fault" if faulted else "recovered", reason=self.fault.reason)
                self.publish("fault" if faulted else "recovered", reason=self.fault.reason)
                if not faulted:
                    self.publish("fault-cleared", fault="device-down")
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
            regions=self.memory.allocator.count,
            ub_tx_count=min(c.tx_count, U64_MAX),
            ub_tx_bytes=min(c.tx_bytes, U64_MAX),
            ub_rx_count=min(c.rx_count, U64_MAX),
            ub_rx_bytes=min(c.rx_bytes, U64_MAX),
            inbox_depth=self.inbox.qsize(),
            utilization=self.utilization(),
            faulted=self.fault.faulted,
            broker_connected=bus is not None and bus.connected,
            events_pending=bus.pending if bus is not None else 0,
            events_dropped=bus.dropped if bus is not None else 0,
            ecc_uncorrectable_errors=self.effects.poison.reads_refused,
            ecc_poisoned_bytes=self.effects.poison.bytes,
            dies_down=sorted(self.effects.dies_down),
            compute_share=self.effects.compute_share,
            fault_errors=self.effects.errors,
            faults=[*(["device-down"] if self.fault.faulted else []), *self.catalogue],
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
            raise InvalidArgumentError(f"label longer than {MAX_LABEL} characters", field="label")
        with blame(field="size", subject=self.state.device.id):
            region = self.state.memory.allocate(request.size, request.label)
        self.state.log.debug("allocated", region=region.region_id, size=region.size)
        return region_proto(self.state, region)

    @rpc
    async def FreeRegion(
        self, request: device_pb2.FreeRegionRequest, context: Context
    ) -> device_pb2.FreeRegionResponse:
        self.state.require_healthy()
        if request.region_id == 0:
            raise InvalidArgumentError("region_id is required", field="region_id")
        with blame(
            field="region_id",
            subject=str(request.region_id),
            reason="REGION_NOT_FOUND",
            on=NotFoundError,
        ):
            region = self.state.memory.free(request.region_id)
        return device_pb2.FreeRegionResponse(freed_bytes=region.size)

    @rpc
    async def ListRegions(
        self, request: device_pb2.ListRegionsRequest, context: Context
    ) -> device_pb2.ListRegionsResponse:
        alloc = self.state.memory.allocator
        page_max = self.state.profile.limits.list_regions_page_max
        size = min(request.page_size or page_max, page_max)
        start = 0
        if request.page_token:
            if not request.page_token.isdigit() or len(request.page_token) > 20:
                raise InvalidArgumentError(
                    f"page_token {quote(request.page_token)} is not one this device gave",
                    field="page_token",
                    reason="INVALID_PAGE_TOKEN",
                )
            start = alloc.index_at(int(request.page_token))
        page = alloc.regions(start, size + 1)
        return device_pb2.ListRegionsResponse(
            regions=[region_proto(self.state, r) for r in page[:size]],
            capacity_bytes=alloc.capacity,
            used_bytes=alloc.used,
            free_bytes=alloc.free,
            largest_free_bytes=alloc.largest_free,
            next_page_token=str(page[size].offset) if len(page) > size else "",
            region_count=alloc.count,
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
            raise InvalidArgumentError(f"reason longer than {MAX_LABEL} characters", field="reason")
        await self.state.set_fault(request.faulted, request.reason)
        if not request.faulted:
            devicefaults.forget(self.state, devicefaults.DEVICE_DOWN)
        f = self.state.fault
        return device_pb2.FaultState(faulted=f.faulted, reason=f.reason, since_ns=f.since_ns)

    @rpc
    async def InjectFault(
        self, request: device_pb2.FaultState, context: Context
    ) -> device_pb2.FaultState:
        return await devicefaults.inject(self.state, request)

    @rpc
    async def ClearFault(
        self, request: device_pb2.ClearDeviceFaultRequest, context: Context
    ) -> device_pb2.FaultState:
        return await devicefaults.clear(self.state, request)

    @rpc
    async def ListFaults(
        self, request: device_pb2.ListDeviceFaultsRequest, context: Context
    ) -> device_pb2.DeviceFaultList:
        return devicefaults.list_faults(self.state, request)
