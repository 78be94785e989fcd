"""One device as the domain sees it: its memory, its health, what its faults do, its counters.

The unified bus (engines/device/ub.py), an NPU's dies (engines/device/npu.py) and the
catalogue's faults (engines/device/faults.py) hang off the engine; the gRPC servicers of
services/ translate requests into calls on them and answers back, nothing more. The engine
knows nothing of the server that hosts it beyond the `Server` protocol: its health, and a crash's
stop and restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.peers import Directory
from cmemu.emulator.model.errors import (
    RETRY_AFTER_S,
    DataLossError,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    quote,
)
from cmemu.emulator.model.faults.memory import Corruption, Poison
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.instruments import Histogram
from cmemu.emulator.model.memory import DeviceMemory, QueueBudget, Region, RegionPage
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.topology import Device, Topology
from cmemu.emulator.model.ub import Message

if TYPE_CHECKING:
    from cmemu.emulator.engines.clock import Timeline
    from cmemu.emulator.engines.device.faults import DeviceFaults
    from cmemu.emulator.engines.device.liveness import Liveness
    from cmemu.emulator.engines.device.npu import Dies
    from cmemu.emulator.engines.device.ub import Bus

U64_MAX = 2**64 - 1
MAX_LABEL = 256  # characters of a region's label (and of a fault's reason)

MANAGEMENT = frozenset({"SetFaultState", "InjectFault", "ClearFault", "ListFaults"})
"""Device methods that model the out-of-band management path (a BMC): they keep answering
when the device hangs, so that a hang can be cleared, and answer for a crashed sibling."""


class Server(Protocol):
    """What a device asks of the server that hosts it (services/host.py implements it)."""

    async def set_serving(self, serving: bool) -> None: ...

    async def set_part(self, name: str, serving: bool) -> None: ...

    async def stop(self, *, deferred: bool) -> None: ...

    async def restart(self) -> None: ...


@dataclass
class Counters:
    """A device's unified-bus traffic and its faults, counted since it started."""

    tx_count: int = 0
    tx_bytes: int = 0
    rx_count: int = 0
    rx_bytes: int = 0
    faults: int = 0  # times the device went down


@dataclass
class Latencies:
    """Emulated latency, issue to completion, of what this device issued: UB transactions by op
    and kernels (queueing included). Counted on the path, read by the metrics collector."""

    ub: dict[str, Histogram] = field(default_factory=dict)
    kernel: Histogram = field(default_factory=Histogram)

    def ub_op(self, op: str, seconds: float) -> None:
        histogram = self.ub.get(op)
        if histogram is None:
            histogram = self.ub[str(op)] = Histogram()  # a plain name, whatever str came
        histogram.observe(seconds)


@dataclass(frozen=True)
class FaultState:
    """Down (device-down, SetFaultState) or up, since when (emulated ns)."""

    faulted: bool = False
    reason: str = ""
    since_ns: int = 0


class Answering(asyncio.Event):
    """An Event (cleared: the device hangs) whose state is also a plain field, `open`: read
    twice by every UB transaction of this process, where `is_set()` is a Python call."""

    def __init__(self) -> None:
        super().__init__()
        self.open = False

    def set(self) -> None:
        self.open = True
        super().set()

    def clear(self) -> None:
        self.open = False
        super().clear()


@dataclass
class Effects:
    """What the catalogue's active faults do to the device: read on the hot paths, so plain
    fields, not a lookup per call."""

    crashed: bool = False
    answering: Answering = field(default_factory=Answering)  # cleared: hung
    compute_share: float = 1.0
    dies_down: set[int] = field(default_factory=set)
    poison: Poison = field(default_factory=Poison)
    corruption: Corruption = field(default_factory=Corruption)  # sdc: reads flipped silently
    errors: int = 0  # calls refused because of a fault

    def __post_init__(self) -> None:
        self.answering.set()


@dataclass(frozen=True, kw_only=True)
class Telemetry:
    """One device's telemetry sample at an emulated instant: memory, traffic, faults, events."""

    device: str
    emulated_ns: int
    memory_capacity_bytes: int
    memory_used_bytes: int
    stored_bytes: int
    regions: int
    ub_tx_count: int
    ub_tx_bytes: int
    ub_rx_count: int
    ub_rx_bytes: int
    inbox_depth: int
    utilization: float
    faulted: bool
    broker_connected: bool
    events_pending: int
    events_dropped: int
    ecc_uncorrectable_errors: int
    ecc_poisoned_bytes: int
    dies_down: tuple[int, ...]
    compute_share: float
    fault_errors: int
    faults: tuple[str, ...]


class DeviceEngine:
    """Everything one device knows and does; owned by one event loop."""

    def __init__(
        self,
        *,
        device: Device,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Directory,
        memory: DeviceMemory,
        dies: int = 0,
        queue_budget: QueueBudget | None = None,
        events: EventSink | None = None,
    ) -> None:
        from cmemu.emulator.engines.device.faults import DeviceFaults
        from cmemu.emulator.engines.device.npu import Dies
        from cmemu.emulator.engines.device.ub import Bus

        self.device = device
        self.topology = topology
        self.profile = profile
        self.clock = clock
        self.peers = peers
        self.memory = memory
        self.queue_budget = queue_budget  # the process's cap on queued messages
        self.events = events
        self.counters = Counters()
        self.latency = Latencies()
        self.fault = FaultState()
        self.effects = Effects()
        self._inbox: asyncio.Queue[Message] | None = None  # made by the first SEND or RECV
        self.server: Server | None = None  # set by whoever serves it
        # its process's liveness (engines/device/liveness.py), told when its health moves
        self.liveness: Liveness | None = None
        self.on_change: Callable[[], None] | None = None
        self._log: structlog.typing.FilteringBoundLogger | None = None
        self.bus: Bus = Bus(self)
        self.dies: Dies = Dies(self, dies)
        self.faults: DeviceFaults = DeviceFaults(self)

    @property
    def inbox(self) -> asyncio.Queue[Message]:
        """Its queued messages, made when first used: most devices never take a SEND, and an
        empty queue is four deques (2.3 MB for cm384's 624 devices, issue 18's memory)."""
        if self._inbox is None:
            self._inbox = asyncio.Queue(maxsize=self.profile.limits.inbox_max_messages)
        return self._inbox

    @property
    def inbox_depth(self) -> int:
        return 0 if self._inbox is None else self._inbox.qsize()

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger:
        """Bound to its id when it first logs (most devices never do)."""
        if self._log is None:
            self._log = structlog.get_logger("cmemu.device").bind(device=self.device.id)
        return self._log

    # --- the gate every call passes --------------------------------------------------------

    def unreachable(self) -> UnavailableError:
        """What a caller in this process gets from a crashed device: what a gRPC client gets
        from its closed port."""
        return UnavailableError(
            f"{self.device.id} is unreachable (crashed)",
            subject=self.device.id,
            reason="PEER_UNREACHABLE",
            retry_after_s=RETRY_AFTER_S,
        )

    async def admit(self, method: str) -> None:
        """Every call's gate: a crashed device refuses everything, a hung one never answers,
        until its fault clears; a hung device's fault-control methods still answer."""
        if self.effects.crashed:  # its own server is gone; its siblings answer for it
            self.effects.errors += 1
            raise self.unreachable()
        if method in MANAGEMENT:
            return
        if not self.effects.answering.is_set():
            await self.effects.answering.wait()

    @property
    def silent(self) -> bool:
        """Crashed or hung: the device sends no telemetry and no liveness."""
        return self.effects.crashed or not self.effects.answering.open

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
        """Refuse an access to a down die's HBM half (NPU)."""
        if self.effects.dies_down and self.dies.count:
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

    # --- health ------------------------------------------------------------------------------

    def fault_state(self) -> FaultState:
        return self.fault

    async def set_fault(self, faulted: bool, reason: str, *, announce: bool = True) -> None:
        """Down or up (device-down). `announce=False`: the caller (the catalogue's device-down)
        publishes the fault events itself."""
        changed = faulted != self.fault.faulted
        self.fault = FaultState(
            faulted=faulted,
            reason=(reason or "injected") if faulted else "",
            since_ns=self.clock.now_ns() if changed else self.fault.since_ns,
        )
        if not changed:
            return
        self.counters.faults += int(faulted)
        if announce:
            self.log.warning("fault" if faulted else "recovered", reason=self.fault.reason)
            self.publish("fault" if faulted else "recovered", reason=self.fault.reason)
            if not faulted:
                self.publish("fault-cleared", fault="device-down")
        self.publish("health", status="NOT_SERVING" if faulted else "SERVING")
        self.health_moved()
        await self.show_health()

    def health_moved(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def show_health(self) -> None:
        """The server's health as the device is: NOT_SERVING while down, each down die too."""
        if self.server is None:
            return
        await self.server.set_serving(not self.fault.faulted)
        for die in self.effects.dies_down:
            await self.server.set_part(die_name(self.device.id, die), False)

    # --- memory ------------------------------------------------------------------------------

    def allocate(self, size: int, label: str) -> Region:
        if len(label) > MAX_LABEL:  # before health, as the servicer checked its request
            raise InvalidArgumentError(f"label longer than {MAX_LABEL} characters", field="label")
        self.require_healthy()
        try:  # `with blame(...)`'s annotations, at no cost per call (two of every EMS put)
            region = self.memory.allocate(size, label)
        except EmulatorError as exc:
            exc.annotate(field="size", subject=self.device.id)
            raise
        self.log.debug("allocated", region=region.region_id, size=region.size)
        return region

    def free(self, region_id: int) -> int:
        """Free a region; its size."""
        self.require_healthy()
        try:  # `with blame(...)`'s annotations, at no cost per call (two of every EMS put)
            return self.memory.free(region_id).size
        except NotFoundError as exc:
            exc.annotate(field="region_id", subject=str(region_id), reason="REGION_NOT_FOUND")
            raise

    def region_page(self, page_token: str, page_size: int) -> RegionPage:
        """A page of the live regions by address, from `page_token` (one this device gave: the
        offset of the page's first region; "" from the start), at most `page_size` of them (0,
        or past the profile's cap: the cap). No health check: a faulted pool still lists."""
        alloc = self.memory.allocator
        page_max = self.profile.limits.list_regions_page_max
        size = min(page_size or page_max, page_max)
        start = 0
        if page_token:
            if not (page_token.isascii() and page_token.isdigit()) or len(page_token) > 20:
                raise InvalidArgumentError(
                    f"page_token {quote(page_token)} is not one this device gave",
                    field="page_token",
                    reason="INVALID_PAGE_TOKEN",
                )
            start = alloc.index_at(int(page_token))
        page = alloc.regions(start, size + 1)
        return RegionPage(
            regions=tuple(page[:size]),
            next_page_token=str(page[size].offset) if len(page) > size else "",
            capacity_bytes=alloc.capacity,
            used_bytes=alloc.used,
            free_bytes=alloc.free,
            largest_free_bytes=alloc.largest_free,
            region_count=alloc.count,
        )

    # --- what it reports ---------------------------------------------------------------------

    def telemetry(self) -> Telemetry:
        c = self.counters
        bus = self.events
        return Telemetry(
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
            inbox_depth=self.inbox_depth,
            utilization=self.dies.utilization(),
            faulted=self.fault.faulted,
            broker_connected=bus is not None and bus.connected,
            events_pending=bus.pending if bus is not None else 0,
            events_dropped=bus.dropped if bus is not None else 0,
            ecc_uncorrectable_errors=self.effects.poison.reads_refused,
            ecc_poisoned_bytes=self.effects.poison.bytes,
            dies_down=tuple(sorted(self.effects.dies_down)),
            compute_share=self.effects.compute_share,
            fault_errors=self.effects.errors,
            faults=(*(["device-down"] if self.fault.faulted else []), *self.faults.active),
        )

    def publish(self, event: str, **detail: Any) -> None:
        if self.events is not None:
            self.events.event(
                self.device.id, event, self.clock.now_ns(), kind=self.device.kind.value, **detail
            )


def die_name(device: str, die: int) -> str:
    """A die's health service name: the die's id, "n00-npu3.d1"."""
    return die_id(device, die)
