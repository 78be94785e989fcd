"""The fabric of a running emulator as a program (or the CLI) calls it: routes, link loads and
the xfer operation (allocate a region on the target, submit one size-only UB transaction from
the issuer, free the region), with domain types in and out.

Every failure is the EmulatorError its status names (emulator/client/status.py), whether the
device, the fabric or the channel failed: a caller catches one type. The message is the
server's own, unprefixed, so `cmemu` prints what the server said."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import error_from, reply_of
from cmemu.emulator.client.wire import fabric as wire
from cmemu.emulator.client.wire import ub as ub_wire
from cmemu.emulator.engines.fabric.types import LinkStats
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.scaleout import check_ub_within
from cmemu.emulator.model.ub import Completion, Op, Transaction
from cmemu.v1 import device_pb2, fabric_pb2, fabric_pb2_grpc

XFER_OPS = (Op.READ, Op.WRITE)
"""The ops an xfer moves a size with (the atomics and SEND carry values, not a bulk size)."""
MIN_WATCH_INTERVAL_S = 0.01  # the fabric's floor for WatchLinkStats


@dataclass(frozen=True, kw_only=True)
class RouteInfo:
    """A route through the UB fabric, uncontended: what a transfer's timing starts from."""

    path: tuple[str, ...]
    planes: int
    max_gb_s: float
    latency_ns: int


@dataclass(frozen=True, kw_only=True)
class Xfer:
    """One finished xfer: who moved how much, and the fabric's completion of it."""

    src: str
    dst: str
    op: Op
    size: int
    completion: Completion

    @property
    def emulated_s(self) -> float:
        return (self.completion.complete_ns - self.completion.issue_ns) / 1e9

    @property
    def bandwidth_gb_s(self) -> float:
        seconds = self.emulated_s
        return self.size / seconds / 1e9 if seconds > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class ClockInfo:
    """The supernode's emulated clock as its owner, the fabric, reports it (see
    cmemu.v1.ClockInfo for each figure)."""

    epoch_wall_s: float  # the wall instant (Unix seconds) at which emulated time is 0
    time_scale: float  # emulated seconds per wall second asked for: a ceiling
    emulated_ns: int
    rate: float  # emulated seconds per wall second now
    achieved_scale: float  # since the epoch
    longest_stall_s: float
    stalled_s: float
    slowest: str  # the process whose lag sets the rate now ("" at time_scale)
    worst_lag_s: float
    worst_lag_emulated_s: float
    silent: tuple[str, ...]  # processes that stopped reporting
    dilation: bool


Pacing = Callable[[RouteInfo, float], contextlib.AbstractContextManager[object]]
"""What runs while a transfer is in flight (a progress bar): given the route and the supernode's
time scale, a context entered just before the submit and left as soon as it completes."""


class FabricClient:
    """The fabric of a launch's supernodes, over the channels of `clients` (not closed here:
    the caller owns them)."""

    def __init__(self, clients: Clients, *, timeout_s: float | None = None) -> None:
        """`timeout_s`: every unary call's wall deadline (None: none); a method's own
        `deadline_s`, where it takes one, wins (its caller passes on what is left of its own)."""
        self._clients = clients
        self._timeout_s = timeout_s

    def _deadline(self, deadline_s: float | None) -> float | None:
        return self._timeout_s if deadline_s is None else deadline_s

    async def route(self, src: str, dst: str) -> RouteInfo:
        """The route between two devices (or NPU dies, `n00-npu3.d1`) of this supernode."""
        request = fabric_pb2.RouteRequest(src=src, dst=dst)
        return _route(
            await reply_of(None, self._clients.fabric().Route(request, timeout=self._timeout_s))
        )

    async def clock(
        self, *, deadline_s: float | None = None, address: str | None = None
    ) -> ClockInfo:
        """Where emulated time stands (DeadlineExceededError after `deadline_s` wall seconds);
        `address`: another fabric's (sn0's, whose epoch the other supernodes take)."""
        request = fabric_pb2.GetClockRequest()
        fabric = (
            self._clients.fabric()
            if address is None
            else fabric_pb2_grpc.FabricStub(self._clients.channel_to(address))
        )
        m = await reply_of(None, fabric.GetClock(request, timeout=self._deadline(deadline_s)))
        return ClockInfo(
            epoch_wall_s=m.epoch_wall_s,
            time_scale=m.time_scale,
            emulated_ns=m.emulated_ns,
            rate=m.rate,
            achieved_scale=m.achieved_scale,
            longest_stall_s=m.longest_stall_s,
            stalled_s=m.stalled_s,
            slowest=m.slowest,
            worst_lag_s=m.worst_lag_s,
            worst_lag_emulated_s=m.worst_lag_emulated_s,
            silent=tuple(m.silent),
            dilation=m.dilation,
        )

    async def link_stats(self, top: int, *, deadline_s: float | None = None) -> LinkStats:
        """The `top` busiest directed links (0: the fabric's default, 20)."""
        request = fabric_pb2.LinkStatsRequest(top=_top(top))
        call = self._clients.fabric().GetLinkStats(request, timeout=self._deadline(deadline_s))
        return wire.link_stats(await reply_of(None, call))

    async def watch_link_stats(
        self, top: int, interval_s: float
    ) -> AsyncGenerator[LinkStats, None]:
        """The link table again every `interval_s` wall seconds (10 ms at the least), until the
        caller stops iterating."""
        if interval_s < 0:
            raise InvalidArgumentError(
                f"interval must not be negative, got {interval_s}", field="interval_ms"
            )
        interval_ms = max(round(MIN_WATCH_INTERVAL_S * 1000), round(interval_s * 1000))
        request = fabric_pb2.WatchLinkStatsRequest(top=_top(top), interval_ms=interval_ms)
        stream = self._clients.fabric().WatchLinkStats(request)
        try:
            async for stats in stream:
                yield wire.link_stats(stats)
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc) from None
        finally:
            stream.cancel()

    async def xfer(
        self,
        src: str,
        dst: str,
        size: int,
        *,
        op: Op = Op.WRITE,
        src_die: int = 0,
        label: str = "cmemu xfer",
        pacing: Pacing | None = None,
    ) -> Xfer:
        """Move `size` bytes (size only, no payload) between `src` and `dst`, both in one
        supernode, whose fabric times it: a region of `size` is allocated on `dst` for the
        transfer to land in and freed afterwards, whatever happened."""
        if op not in XFER_OPS:
            raise InvalidArgumentError(
                f"an xfer reads or writes; got op {op.value!r}", field="op", subject=op.value
            )
        if size <= 0:
            raise InvalidArgumentError(f"size must be positive, got {size}", field="size")
        source, target = self._clients.find(src), self._clients.find(dst)
        sn = self._clients.supernode(check_ub_within(source.id, target.id))
        device = sn.device(target.id)
        request = device_pb2.AllocateRegionRequest(size=size, label=label)
        region = await reply_of(None, device.AllocateRegion(request, timeout=self._timeout_s))
        try:
            in_flight: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
            if pacing is not None:
                in_flight = pacing(
                    await FabricClient(sn, timeout_s=self._timeout_s).route(src, dst),
                    sn.topology.time_scale,
                )
            tx = Transaction(
                op=op,
                dst_eid=target.eid,
                dst_offset=region.offset,
                size=size,
                size_only=True,
                src_die=src_die,
            )
            with in_flight:
                done = await reply_of(
                    None,
                    sn.bus(source.id).Submit(
                        ub_wire.transaction_proto(tx), timeout=self._timeout_s
                    ),
                )
        finally:
            free = device_pb2.FreeRegionRequest(region_id=region.region_id)
            await reply_of(None, device.FreeRegion(free, timeout=self._timeout_s))
        return Xfer(
            src=source.id, dst=target.id, op=op, size=size, completion=ub_wire.completion(done)
        )


def _route(m: fabric_pb2.RouteInfo) -> RouteInfo:
    return RouteInfo(
        path=tuple(m.path), planes=m.planes, max_gb_s=m.max_gb_s, latency_ns=m.latency_ns
    )


def _top(top: int) -> int:
    if top < 0:
        raise InvalidArgumentError(f"top must be 0 or more, got {top}", field="top")
    return top
