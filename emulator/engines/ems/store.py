"""What every part of EMS's store shares: the memory pools, where copies go (the placement), the
SSD tier, the counters and the lock, and the one way a pool or device is reached (its typed peer,
emulator/engines/peers.py `DevicePeer`: the device's engine in this process, else the gRPC
client; both raise EmulatorErrors). The write and read paths, the tombstones and the sweep (the
other modules of this package) each take this, not each other's internals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.deadline import no_answer
from cmemu.emulator.engines.ems.ssd import SsdTier
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.engines.peers import DevicePeer
from cmemu.emulator.engines.wheel import DeadlineWheel
from cmemu.emulator.model.ems import (
    Counters,
    HashRing,
    Health,
    Index,
    Listed,
    ObjectMeta,
    Placement,
    Replica,
    Timing,
    encode_label,
    encode_trailer,
    spans,
    trailer_bytes,
)
from cmemu.emulator.model.errors import (
    RETRY_AFTER_S,
    DeadlineExceededError,
    EmulatorError,
    NotFoundError,
    UnavailableError,
)
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.memory import Region
from cmemu.emulator.model.topology import Device, DeviceKind, Topology
from cmemu.emulator.model.ub import Completion, Op, Transaction

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import FaultState

T = TypeVar("T")

MIN_PAUSE_S = 0.01  # wall floor of a periodic pause: a fast time_scale stretches the period
UNREACHABLE: tuple[type[EmulatorError], ...] = (UnavailableError, DeadlineExceededError)
# lazy: `.bind()` here would build the logger at import, before logging is configured (stdout)
log = structlog.get_logger("cmemu.ems", device="ems")


class Devices(Protocol):
    """How the store reaches a pool or a device (services/peers.py `Peers` is one): the runtime
    decides whether it is a direct call or a gRPC one."""

    def device(self, device: Device) -> DevicePeer: ...


def region_size(meta: ObjectMeta) -> int:
    return meta.size + (trailer_bytes(meta.size, meta.chunk_bytes) if meta.chunked else 0)


class Store:
    name = "ems"

    def __init__(
        self,
        *,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Devices,
        ssd_dir: Path,
        events: EventSink | None = None,
    ) -> None:
        self.topology = topology
        self.events = events
        self.profile = profile
        self.ems = profile.ems
        self.clock = clock
        self.peers = peers
        self.pools = {d.id: d for d in topology.of_kind(DeviceKind.MEMPOOL)}
        pool_bytes = profile.pool_bytes
        self.placement = Placement(
            pools={p: d.node for p, d in self.pools.items()},
            ring=HashRing(list(self.pools), self.ems.vnodes_per_pool),
            capacity_per_pool=int(pool_bytes * self.ems.dram_share),
            replication_factor=self.ems.replication_factor,
            suspect_after_sweeps=self.ems.suspect_after_sweeps,
            dead_after_ns=int(self.ems.dead_after_s * 1e9),
        )
        self.ssd = SsdTier(ssd_dir, len(topology.nodes) * self.ems.ssd_bytes_per_node)
        self.counters = Counters()
        self.lock = asyncio.Lock()
        self.unreconciled: set[str] = set()  # pools not listed since this EMS started
        # Until rebuild() has read every pool (or given up on those that do not answer), the
        # index lacks keys a pool not yet listed holds: calls about keys answer UNAVAILABLE
        # RECOVERING (retryable), never NOT_FOUND for an acknowledged key (issue 21 finding 3).
        self.recovering = True
        self.listed: set[str] = set()  # pools the rebuild has read
        self._wheels: dict[float, DeadlineWheel] = {}  # a bound's length -> its calls' timer

    def publish(self, event: str, **detail: Any) -> None:
        if self.events is not None:
            self.events.event(self.name, event, self.clock.now_ns(), **detail)

    @property
    def index(self) -> Index:
        return self.placement.index

    @index.setter
    def index(self, index: Index) -> None:
        self.placement.index = index

    def pause_s(self, emulated_s: float) -> float:
        return max(self.clock.clock.wall_delay_s(emulated_s), MIN_PAUSE_S)

    def serving(self) -> None:
        """Refuse a call about keys while the index is being rebuilt (see `recovering`)."""
        if self.recovering:
            raise UnavailableError(
                f"EMS is rebuilding its index after a start: {len(self.listed)} of "
                f"{len(self.pools)} memory pools listed; retry",
                reason="RECOVERING",
                retry_after_s=RETRY_AFTER_S,
            )

    def requester(self, device_id: str) -> Device | None:
        return self.topology.device(device_id) if device_id else None

    def new_gen(self) -> int:
        return self.index.next_gen(int(self.clock.clock.wall() * 1e9))

    # --- device access -------------------------------------------------------------------------

    async def _within(self, device: Device, call: Coroutine[Any, Any, T], emulated_s: float) -> T:
        """A call to a device's peer, bounded in emulated time (see engines/deadline.py: a bound
        in wall seconds failed healthy pools on a starved host), on one timer per bound's
        length (engines/wheel.py: a put makes six such calls, a get one), entered only by a
        call that waits (DeadlineWheel.run: a pool of this process answers at once)."""
        try:
            return await self._wheel(emulated_s).run(call)
        except TimeoutError:
            raise no_answer(device.id, emulated_s) from None

    def _wheel(self, emulated_s: float) -> DeadlineWheel:
        wheel = self._wheels.get(emulated_s)
        if wheel is None:
            wheel = self._wheels[emulated_s] = DeadlineWheel(
                self.clock.clock, emulated_s, min_wall_s=self.ems.timeout_min_wall_s
            )
        return wheel

    async def _reached(self, device: Device, call: Coroutine[Any, Any, T], emulated_s: float) -> T:
        """`_within`, and a pool that does not answer is suspect at once, ahead of the next
        sweep. (`_within`'s body here, not its frame: a put passes here six times, a get once.)"""
        try:
            return await self._wheel(emulated_s).run(call)
        except TimeoutError:  # no_answer: a DeadlineExceededError, UNREACHABLE
            if device.id in self.pools:
                self.suspect(device.id)
            raise no_answer(device.id, emulated_s) from None
        except EmulatorError as exc:
            if isinstance(exc, UNREACHABLE) and device.id in self.pools:
                self.suspect(device.id)
            raise

    async def fault_state(self, device: Device) -> FaultState:
        """A device's fault state, within a probe's wait (no suspicion: the caller judges)."""
        call = self.peers.device(device).fault_state(deadline_s=None)
        return await self._within(device, call, self.ems.probe_timeout_s)

    def suspect(self, pool: str) -> None:
        if self.placement.suspect(pool, self.clock.now_ns()):
            log.warning("pool suspect", pool=pool)

    async def transfer(
        self,
        issuer: Device,
        op: Op,
        *,
        pool: str,
        replica: Replica,
        size: int,
        offset: int = 0,
        data: bytes = b"",
        size_only: bool = False,
    ) -> Completion:
        tx = Transaction(
            op=op,
            dst_eid=self.pools[pool].eid,
            dst_offset=replica.offset + offset,
            size=size,
            data=data if op is Op.WRITE and not size_only else b"",
            size_only=size_only,
        )
        peer = self.peers.device(issuer)
        return await self._reached(issuer, peer.submit(tx, deadline_s=None), self.ems.io_timeout_s)

    async def read_copy(
        self, issuer: Device, pool: str, replica: Replica, span: tuple[int, int], size_only: bool
    ) -> Completion:
        """`transfer` of a READ of a piece of a copy (`span`: its offset and size), as a get
        reads one: a Transaction of the fields a read sets."""
        offset, size = span
        tx = Transaction(
            op=Op.READ, dst_eid=self.pools[pool].eid, dst_offset=replica.offset + offset, size=size,
            size_only=size_only,
        )  # fmt: skip
        call = self.peers.device(issuer).submit(tx, deadline_s=None)
        return await self._reached(issuer, call, self.ems.io_timeout_s)

    async def write_copy(
        self, issuer: Device, pool: str, replica: Replica, meta: ObjectMeta, data: bytes
    ) -> Timing:
        """One copy, a chunk per transaction (then the chunk table), one after another."""
        timing = Timing()
        if not meta.real:
            done = await self.transfer(
                issuer, Op.WRITE, pool=pool, replica=replica, size=meta.size, size_only=True,
            )  # fmt: skip
            timing.add(done.issue_ns, done.complete_ns)
            return timing
        if meta.chunked:
            assert meta.crcs is not None
            pieces = [(s, data[s : s + n]) for s, n in spans(meta.size, meta.chunk_bytes)]
            pieces.append((meta.size, encode_trailer(meta.chunk_bytes, meta.crcs)))
        else:  # one piece, the whole of it: not sliced (copied) out of itself
            pieces = [(0, data)]
        elapsed = 0
        for offset, piece in pieces:
            done = await self.transfer(
                issuer, Op.WRITE, pool=pool, replica=replica, size=len(piece),
                offset=offset, data=piece,
            )  # fmt: skip
            timing.issue_ns = timing.issue_ns or done.issue_ns
            elapsed += done.complete_ns - done.issue_ns
        timing.duration_ns = elapsed
        return timing

    async def place(self, meta: ObjectMeta, pool: str, label: str | None = None) -> Replica:
        """A region for a copy of `meta` on `pool`, labelled with its metadata (`label`: that
        label already encoded, for the copies of one put)."""
        label = encode_label(meta) if label is None else label
        region = await self.allocate(pool, region_size(meta), label)
        return Replica(region_id=region.region_id, offset=region.offset)

    async def allocate(self, pool: str, size: int, label: str) -> Region:
        device = self.pools[pool]
        peer = self.peers.device(device)
        call = peer.allocate(size, label, deadline_s=None)
        return await self._reached(device, call, self.ems.call_timeout_s)

    async def free_region(self, pool: str, region_id: int) -> bool:
        """Give a region back; False when the pool cannot be told now (it is not up)."""
        if self.placement.health[pool] is not Health.UP:
            return False
        device = self.pools[pool]
        try:
            peer = self.peers.device(device)
            call = peer.free(region_id, deadline_s=None)
            await self._reached(device, call, self.ems.call_timeout_s)
        except EmulatorError as exc:
            return isinstance(exc, NotFoundError)  # gone already
        return True

    async def free_all(self, regions: dict[str, int]) -> bool:
        """Free the regions (pool -> region id) that can be; True when none is left."""
        for pool, region_id in list(regions.items()):
            if await self.free_region(pool, region_id):
                del regions[pool]
        return not regions

    async def list_regions(self, pool: Device) -> list[Listed] | None:
        """Every region of a pool, page by page; None when the pool does not answer."""
        listed: list[Listed] = []
        token = ""
        peer = self.peers.device(pool)
        while True:
            try:
                call = peer.list_regions(token, deadline_s=None)
                found = await self._within(pool, call, self.ems.probe_timeout_s * 5)
            except EmulatorError:
                return None
            listed += [Listed(r.region_id, r.offset, r.label) for r in found.regions]
            token = found.next_page_token
            if not token:
                return listed
