"""A device's side of the unified bus: issuing transactions, applying the ones that arrive, and
its receive queue.

Issue: the device checks the transaction's shape and hands it to the fabric, which routes and
times it and has the target apply it; a copy of the device's own memory crosses no link, and
the device times and applies it itself (Bus._within). Arrival: the target checks first (the
fabric asks with `check_only`: a bad address fails at once, and nothing is timed for it), then
applies when the flow completes, so a transfer that fails applies nothing and a READ returns
the bytes as of its completion.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING

from cmemu.emulator.model.costmodel import check_duration, ub_transfer_ns
from cmemu.emulator.model.errors import (
    CapacityError,
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    blame,
)
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.route import (
    Route,
    address_die,
    local_bytes_per_s,
    local_route,
    priced,
)
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.model.ub import (
    CHECKED_BY_APPLYING,
    PRICED,
    READS_STORED,
    Completion,
    Message,
    Op,
    Transaction,
    checked_size,
    issued,
    normalize,
)

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

MAX_WAIT_MS = 60_000  # emulated milliseconds a Receive may wait for a first message

# A transaction without an id gets this process's random half and a count: 32 hex digits, as a
# uuid4().hex was, unique without a syscall (os.urandom) and a UUID object per transaction.
_ID_PREFIX = os.urandom(8).hex()
_ID_COUNT = itertools.count()


def _new_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNT):016x}"


def _blame_address(exc: EmulatorError, device: str) -> None:
    """The annotations of an error of applying (or checking) a transaction at its address,
    innermost first as nested `blame`s gave them."""
    if isinstance(exc, OutOfRangeError):
        exc.annotate(reason="ADDRESS_OUT_OF_RANGE")
    if isinstance(exc, PreconditionError):
        exc.annotate(reason="REGION_NOT_ALLOCATED")
    exc.annotate(field="dst.offset", subject=device)


class Bus:
    def __init__(self, engine: DeviceEngine) -> None:
        self.engine = engine
        self.inline_max = engine.profile.limits.inline_payload_max_bytes  # read per transaction
        self._local: dict[tuple[Op, int], Route] = {}  # the local route per op and die, priced

    async def submit(self, request: Transaction, deadline_s: float | None) -> Completion:
        """Issue a transaction from this device; the fabric times it and delivers it (a copy
        within this device: the device itself)."""
        e = self.engine
        e.require_healthy()
        size = checked_size(request, self.inline_max)
        e.require_die(request.src_die)
        try:
            target = e.topology.by_eid(request.dst_eid)
        except NotFoundError as exc:  # not `with blame`: nothing per call on the hot path
            exc.annotate(field="dst.eid", subject=str(request.dst_eid), reason="DEVICE_NOT_FOUND")
            raise
        tx = issued(
            request,
            size=size,
            src_eid=e.device.eid,
            issue_ns=e.clock.now_ns(),
            id=request.id or _new_id(),
        )
        # a copy of its own memory (an atomic or a SEND is the fabric's, as from any issuer)
        own = tx.dst_eid == e.device.eid and tx.op in CHECKED_BY_APPLYING
        if own and tx.src_die == self._die(tx):
            completion = await self._within(tx)
        else:
            completion = await e.peers.fabric().transfer(tx, deadline_s=deadline_s)
        e.counters.tx_count += 1
        e.counters.tx_bytes += tx.size
        # the op is a StrEnum: its own name, without the enum's `value` property (two calls)
        e.latency.ub_op(tx.op, (completion.complete_ns - completion.issue_ns) / 1e9)
        e.log.debug("ub submit", trace_id=tx.id, op=tx.op, dst=target.id)
        return completion

    def _die(self, tx: Transaction) -> int:
        """The die whose memory `tx` reaches: an NPU's by its address, no other device's."""
        e = self.engine
        return address_die(e.profile, tx.dst_offset) if e.device.kind is DeviceKind.NPU else 0

    async def _within(self, tx: Transaction) -> Completion:
        """A READ or WRITE of this device's memory by itself (EMS's copies in their own pool):
        it crosses no MatrixLink link, so the fabric has nothing to route, share or cut for it
        (nor does its outage reach it), and where the fabric is a process of its own this saves
        two gRPC calls per copy. Timed as the fabric times a local route (route.local_route, the
        endpoint's copy rate and latency, priced for the op) on this device's clock; checked
        first when still copying (a bad address fails at once), applied once the bytes have
        moved (a READ returns them as of then), and answered at the completion."""
        e = self.engine
        route = self._local.get((tx.op, tx.src_die))
        if route is None:
            route = self._local[tx.op, tx.src_die] = self._local_route(tx.op, tx.src_die)
        seconds = tx.size / route.cap
        try:
            check_duration(route.latency_s + seconds, "the transfer", e.profile)
        except EmulatorError as exc:
            exc.annotate(field="size")
            raise
        moved_s = tx.issue_ns / 1e9 + seconds
        if e.clock.now_ns() < round(moved_s * 1e9):  # still copying: the check now, then wait
            self.deliver(tx, check_only=True, timed=True)
            await e.clock.pace(moved_s)
        completion = self.deliver(tx, check_only=False, timed=True)
        complete_s = moved_s + route.latency_s
        completion.complete_ns = complete_ns = round(complete_s * 1e9)
        if e.clock.now_ns() < complete_ns:  # pace's own test: no coroutine when due
            await e.clock.pace(complete_s)  # the reply waits for the clock, not the data
        completion.path = route.hops
        return completion

    def _local_route(self, op: Op, die: int) -> Route:
        e = self.engine
        device = e.device
        name = die_id(device.id, die) if device.kind is DeviceKind.NPU else device.id
        bytes_per_s = local_bytes_per_s(e.profile, e.topology, device)
        return priced(local_route(name, bytes_per_s, e.profile), PRICED[op], device.kind, e.profile)

    def deliver(self, request: Transaction, check_only: bool, timed: bool = False) -> Completion:
        """Apply a transaction that arrives at this device. The fabric then replaces the timing
        with its own (`timed`: it says so, and nothing is priced here; its own check bounded the
        duration; a SEND's message is stamped with the arrival it gives); a direct caller of
        Deliver gets the uncontended cost model's timing. With `check_only` the transaction is
        checked as it would be applied, and nothing changes.
        A plain call: nothing in it waits, and the fabric of this process delivers every
        transaction once or twice (no coroutine made and stepped for each)."""
        e = self.engine
        e.require_healthy()
        tx = normalize(request, self.inline_max)
        e.require_address(tx.dst_offset, tx.size)
        if tx.dst_eid != e.device.eid:
            raise InvalidArgumentError(
                f"dst.eid {tx.dst_eid} is not {e.device.id} ({e.device.eid})",
                field="dst.eid",
                subject=e.device.id,
                reason="WRONG_DEVICE",
            )
        try:  # not `with blame`: nothing per call on the hot path
            src = e.topology.by_eid(tx.src_eid) if tx.src_eid else e.device
        except NotFoundError as exc:
            exc.annotate(field="src_eid", subject=str(tx.src_eid), reason="DEVICE_NOT_FOUND")
            raise
        now = e.clock.now_ns()
        issue_ns = tx.issue_ns if 0 < tx.issue_ns <= now else now  # never from the future
        try:
            if tx.size > e.memory.capacity:
                raise OutOfRangeError(
                    f"{tx.size} bytes are more than {e.device.id}'s {e.memory.capacity} bytes",
                    reason="TRANSFER_TOO_LARGE",
                )
            duration = 0
            if not timed:
                duration = ub_transfer_ns(
                    tx.size,
                    src=src.kind,
                    dst=e.device.kind,
                    cross_node=src.node != e.device.node,
                    profile=e.profile,
                    op=PRICED[tx.op],
                )
                check_duration(duration / 1e9, "the transfer", e.profile)
        except EmulatorError as exc:
            exc.annotate(field="size", subject=e.device.id)
            raise
        completion = Completion(
            id=tx.id,
            op=tx.op,
            src_eid=src.eid,
            dst_eid=e.device.eid,
            size=tx.size,
            issue_ns=issue_ns,
            # timed elsewhere (the RDMA plane), or the uncontended cost model
            complete_ns=max(tx.arrive_ns, issue_ns) if tx.arrive_ns else issue_ns + duration,
            path=(src.id, e.device.id) if src is not e.device else (e.device.id,),
        )
        try:  # what `with blame(...)` x3 did, at no cost per call on the hot path
            if tx.op in READS_STORED:  # Op.reads_stored, without a property call
                e.require_unpoisoned(tx.dst_offset, tx.size)
            if check_only:
                self._check(tx)
                return completion
            self._apply(tx, completion, sender=tx.src_device or src.id)
            if tx.op is Op.WRITE and e.effects.poison.ranges:
                e.effects.poison.heal(tx.dst_offset, tx.size)  # rewritten bytes are good again
        except EmulatorError as exc:
            _blame_address(exc, e.device.id)
            raise
        e.counters.rx_count += 1
        e.counters.rx_bytes += tx.size
        return completion

    def _check(self, tx: Transaction) -> None:
        """Everything applying `tx` would refuse, refused now; nothing changes."""
        memory = self.engine.memory
        if tx.op.atomic:
            memory.check_word(tx.dst_offset)
        elif tx.op is Op.SEND:
            self._check_queue(len(tx.data))
        elif tx.op is Op.WRITE and not tx.size_only:
            memory.check_write(tx.dst_offset, tx.size)
        else:
            memory.check(tx.dst_offset, tx.size)

    def _check_queue(self, nbytes: int) -> None:
        e = self.engine
        if e.inbox.full():
            raise CapacityError(
                f"receive queue of {e.device.id}",
                1,
                0,
                unit="messages",
                subject=e.device.id,
                reason="RECEIVE_QUEUE_FULL",
            )
        if e.queue_budget is not None:
            with blame(subject=e.device.id):
                e.queue_budget.check(nbytes)

    def _apply(self, tx: Transaction, out: Completion, *, sender: str) -> None:
        memory = self.engine.memory
        match tx.op:
            case Op.READ:
                if tx.size_only:
                    memory.check(tx.dst_offset, tx.size)
                else:
                    out.data = memory.read(tx.dst_offset, tx.size)
                    if self.engine.effects.corruption.ranges:  # sdc: wrong bytes, no error
                        out.data = self.engine.effects.corruption.flip(tx.dst_offset, out.data)
            case Op.WRITE:
                if tx.size_only:
                    memory.write_virtual(tx.dst_offset, tx.size)
                else:
                    memory.write(tx.dst_offset, tx.data)
            case Op.CAS:
                out.old_value, out.swapped = memory.compare_and_swap(
                    tx.dst_offset, tx.compare, tx.operand
                )
            case Op.FETCH_ADD:
                out.old_value = memory.fetch_add(tx.dst_offset, tx.operand)
            case Op.SEND:
                self._enqueue(tx, out, sender)

    def _enqueue(self, tx: Transaction, out: Completion, sender: str) -> None:
        e = self.engine
        message = Message(
            id=tx.id,
            # a sender named by id only (RDMA, maybe another supernode): no EID names it
            src_eid=out.src_eid if tx.src_eid or sender == e.device.id else 0,
            src_device=sender,
            size=tx.size,
            data=tx.data,
            size_only=tx.size_only,
            issue_ns=out.issue_ns,
            arrive_ns=out.complete_ns,
        )
        self._check_queue(len(tx.data))
        if e.queue_budget is not None:
            e.queue_budget.take(len(tx.data))
        e.inbox.put_nowait(message)

    def _taken(self, message: Message) -> Message:
        if self.engine.queue_budget is not None:
            self.engine.queue_budget.give(len(message.data))
        return message

    async def receive(self, max_messages: int, wait_ms: int) -> list[Message]:
        """Drain up to `max_messages` (0 means 1) SENDs; wait up to `wait_ms` emulated
        milliseconds for a first one."""
        e = self.engine
        e.require_healthy()
        limit = e.profile.limits.inbox_max_messages
        if max_messages > limit:
            raise InvalidArgumentError(f"max_messages must be <= {limit}", field="max_messages")
        if wait_ms > MAX_WAIT_MS:
            raise InvalidArgumentError(f"wait_ms must be <= {MAX_WAIT_MS}", field="wait_ms")
        out: list[Message] = []
        if e.inbox.empty() and wait_ms:
            try:  # emulated time: the wall wait follows the clock's rate
                out.append(self._taken(await e.clock.timeout(e.inbox.get(), wait_ms / 1000)))
            except TimeoutError:
                return out
        while len(out) < max(1, max_messages) and not e.inbox.empty():
            out.append(self._taken(e.inbox.get_nowait()))
        return out

    def drop_volatile(self) -> None:
        """What a restart never keeps: queued messages."""
        e = self.engine
        while not e.inbox.empty():
            message = e.inbox.get_nowait()
            if e.queue_budget is not None:
                e.queue_budget.give(len(message.data))
