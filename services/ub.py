"""The UnifiedBus service every device serves: transactions issued here go to the fabric, and
transactions that arrive are applied to this device's memory or queued in its inbox.

`normalize` is the one check of a transaction's shape, shared with the fabric.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from cmemu.v1 import ub_pb2, ub_pb2_grpc
from emulator.model.costmodel import UbOp, check_duration, ub_transfer_ns
from emulator.model.errors import (
    CapacityError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PreconditionError,
    blame,
)
from services.device import DeviceState
from services.status import Context, rpc

MAX_WAIT_MS = 60_000  # emulated milliseconds a Receive may wait for a first message


CARRIES_PAYLOAD = {ub_pb2.UB_OP_WRITE, ub_pb2.UB_OP_SEND}
ATOMICS = {ub_pb2.UB_OP_CAS, ub_pb2.UB_OP_FETCH_ADD}
PRICED_OP = {  # how the cost model prices each op of the wire
    ub_pb2.UB_OP_READ: UbOp.READ,
    ub_pb2.UB_OP_WRITE: UbOp.WRITE,
    ub_pb2.UB_OP_CAS: UbOp.ATOMIC,
    ub_pb2.UB_OP_FETCH_ADD: UbOp.ATOMIC,
    ub_pb2.UB_OP_SEND: UbOp.SEND,
}
ATOMIC_BYTES = 8
READS_STORED = {ub_pb2.UB_OP_READ, ub_pb2.UB_OP_CAS, ub_pb2.UB_OP_FETCH_ADD}  # poison bites


def normalize(tx: ub_pb2.UbTransaction, inline_max: int) -> ub_pb2.UbTransaction:
    """Check a transaction's shape and fill `size` where it is implied; never touches state."""
    out = ub_pb2.UbTransaction()
    out.CopyFrom(tx)
    if out.op not in ub_pb2.UbOp.values() or out.op == ub_pb2.UB_OP_UNSPECIFIED:
        raise InvalidArgumentError(
            f"op must be one of READ, WRITE, CAS, FETCH_ADD, SEND; got {out.op}", field="op"
        )
    if out.dst.eid == 0:
        raise InvalidArgumentError("dst.eid is required", field="dst.eid")
    if out.op in ATOMICS:
        if out.data or out.size_only or out.size not in (0, ATOMIC_BYTES):
            raise InvalidArgumentError(
                "atomics move exactly 8 bytes and carry no payload", field="size"
            )
        out.size = ATOMIC_BYTES
        return out
    if out.data and out.op not in CARRIES_PAYLOAD:
        raise InvalidArgumentError("only WRITE and SEND carry data", field="data")
    if out.data and out.size_only:
        raise InvalidArgumentError("data and size_only are exclusive", field="size_only")
    if out.data:
        if out.size not in (0, len(out.data)):
            raise InvalidArgumentError(
                f"size {out.size} differs from len(data) {len(out.data)}", field="size"
            )
        out.size = len(out.data)
    if out.size == 0:
        raise InvalidArgumentError("size must be > 0 (or data non-empty)", field="size")
    if out.op in CARRIES_PAYLOAD and not out.data and not out.size_only:
        raise InvalidArgumentError(
            "WRITE and SEND carry data, or set size_only for a bulk transfer", field="data"
        )
    if not out.size_only and out.size > inline_max:
        raise InvalidArgumentError(
            f"{out.size} bytes exceed the {inline_max}-byte inline payload limit; use size_only",
            field="size",
            reason="PAYLOAD_TOO_LARGE",
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
        s.require_die(tx.src_die)
        with blame(
            field="dst.eid", subject=str(tx.dst.eid), reason="DEVICE_NOT_FOUND", on=NotFoundError
        ):
            target = s.topology.by_eid(tx.dst.eid)
        tx.src_eid = s.device.eid
        tx.issue_ns = s.clock.now_ns()
        tx.id = tx.id or uuid.uuid4().hex
        completion = await s.peers.transfer(tx, context.time_remaining())
        s.counters.tx_count += 1
        s.counters.tx_bytes += tx.size
        op = ub_pb2.UbOp.Name(tx.op).removeprefix("UB_OP_").lower()
        s.latency.ub_op(op, (completion.complete_ns - completion.issue_ns) / 1e9)
        s.log.debug("ub submit", trace_id=tx.id, op=ub_pb2.UbOp.Name(tx.op), dst=target.id)
        return completion

    @rpc
    async def Deliver(self, request: ub_pb2.UbTransaction, context: Context) -> ub_pb2.UbCompletion:
        """Apply a transaction that arrives at this device."""
        return await self.deliver(request)

    async def deliver(self, request: ub_pb2.UbTransaction) -> ub_pb2.UbCompletion:
        """Deliver without gRPC: the fabric calls this directly when the device shares its
        process. The fabric then replaces the timing with its own; a direct caller of Deliver
        gets the uncontended cost model's timing. With check_only the transaction is checked
        as it would be applied, and nothing changes."""
        s = self.state
        await s.admit("Deliver")  # the fabric's direct path: a crash refuses, a hang never answers
        s.require_healthy()
        tx = normalize(request, self._inline_max)
        s.require_address(tx.dst.offset, tx.size)
        if tx.dst.eid != s.device.eid:
            raise InvalidArgumentError(
                f"dst.eid {tx.dst.eid} is not {s.device.id} ({s.device.eid})",
                field="dst.eid",
                subject=s.device.id,
                reason="WRONG_DEVICE",
            )
        with blame(
            field="src_eid", subject=str(tx.src_eid), reason="DEVICE_NOT_FOUND", on=NotFoundError
        ):
            src = s.topology.by_eid(tx.src_eid) if tx.src_eid else s.device
        tx.src_device = tx.src_device or src.id  # a SEND's message names its sender
        now = s.clock.now_ns()
        issue_ns = tx.issue_ns if 0 < tx.issue_ns <= now else now  # never from the future
        with blame(field="size", subject=s.device.id):
            if tx.size > s.memory.capacity:
                raise OutOfRangeError(
                    f"{tx.size} bytes are more than {s.device.id}'s {s.memory.capacity} bytes",
                    reason="TRANSFER_TOO_LARGE",
                )
            duration = ub_transfer_ns(
                tx.size,
                src=src.kind,
                dst=s.device.kind,
                cross_node=src.node != s.device.node,
                profile=s.profile,
                op=PRICED_OP[tx.op],
            )
            check_duration(duration / 1e9, "the transfer", s.profile)
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
        if tx.arrive_ns:  # timed elsewhere (the RDMA plane)
            completion.complete_ns = max(tx.arrive_ns, issue_ns)
        with (
            blame(field="dst.offset", subject=s.device.id),
            blame(reason="REGION_NOT_ALLOCATED", on=PreconditionError),
            blame(reason="ADDRESS_OUT_OF_RANGE", on=OutOfRangeError),
        ):
            if tx.op in READS_STORED:
                s.require_unpoisoned(tx.dst.offset, tx.size)
            if tx.check_only:
                self._check(tx)
                return completion
            await self._apply[tx.op](tx, completion)
            if tx.op == ub_pb2.UB_OP_WRITE and s.effects.poison.ranges:
                s.effects.poison.heal(tx.dst.offset, tx.size)  # rewritten bytes are good again
        s.counters.rx_count += 1
        s.counters.rx_bytes += tx.size
        return completion

    def _check(self, tx: ub_pb2.UbTransaction) -> None:
        """Everything applying `tx` would refuse, refused now; nothing changes."""
        memory = self.state.memory
        if tx.op in ATOMICS:
            memory.check_word(tx.dst.offset)
        elif tx.op == ub_pb2.UB_OP_SEND:
            self._check_queue(len(tx.data))
        elif tx.op == ub_pb2.UB_OP_WRITE and not tx.size_only:
            memory.check_write(tx.dst.offset, tx.size)
        else:
            memory.check(tx.dst.offset, tx.size)

    def _check_queue(self, nbytes: int) -> None:
        s = self.state
        if s.inbox.full():
            raise CapacityError(
                f"receive queue of {s.device.id}",
                1,
                0,
                unit="messages",
                subject=s.device.id,
                reason="RECEIVE_QUEUE_FULL",
            )
        if s.queue_budget is not None:
            with blame(subject=s.device.id):
                s.queue_budget.check(nbytes)

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
            # a sender named by id only (RDMA, maybe another supernode): no EID names it
            src_eid=out.src_eid if tx.src_eid or tx.src_device == self.state.device.id else 0,
            src_device=tx.src_device,
            size=tx.size,
            data=tx.data,
            size_only=tx.size_only,
            issue_ns=out.issue_ns,
            arrive_ns=out.complete_ns,
        )
        self._check_queue(len(tx.data))
        if self.state.queue_budget is not None:
            self.state.queue_budget.take(len(tx.data))
        self.state.inbox.put_nowait(message)

    def _taken(self, message: ub_pb2.UbMessage) -> ub_pb2.UbMessage:
        if self.state.queue_budget is not None:
            self.state.queue_budget.give(len(message.data))
        return message

    @rpc
    async def Receive(
        self, request: ub_pb2.ReceiveRequest, context: Context
    ) -> ub_pb2.ReceiveResponse:
        s = self.state
        s.require_healthy()
        limit = s.profile.limits.inbox_max_messages
        if request.max_messages > limit:
            raise InvalidArgumentError(f"max_messages must be <= {limit}", field="max_messages")
        if request.wait_ms > MAX_WAIT_MS:
            raise InvalidArgumentError(f"wait_ms must be <= {MAX_WAIT_MS}", field="wait_ms")
        response = ub_pb2.ReceiveResponse()
        if s.inbox.empty() and request.wait_ms:
            try:  # wait_ms is emulated time: the wall wait scales with time_scale
                async with asyncio.timeout(s.clock.wall_delay_s(request.wait_ms / 1000)):
                    response.messages.append(self._taken(await s.inbox.get()))
            except TimeoutError:
                return response
        while len(response.messages) < max(1, request.max_messages) and not s.inbox.empty():
            response.messages.append(self._taken(s.inbox.get_nowait()))
        return response
