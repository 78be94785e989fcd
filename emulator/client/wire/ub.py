"""UbTransaction / UbCompletion / UbMessage <-> cmemu.emulator.model.ub."""

from __future__ import annotations

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.ub import Completion, Message, Op, Transaction
from cmemu.v1 import ub_pb2

OP_OF = {
    ub_pb2.UB_OP_READ: Op.READ,
    ub_pb2.UB_OP_WRITE: Op.WRITE,
    ub_pb2.UB_OP_CAS: Op.CAS,
    ub_pb2.UB_OP_FETCH_ADD: Op.FETCH_ADD,
    ub_pb2.UB_OP_SEND: Op.SEND,
}
WIRE_OP = {op: wire for wire, op in OP_OF.items()}


def op_of(value: int) -> Op:
    op: Op | None = OP_OF.get(value)  # type: ignore[call-overload]
    if op is None:
        raise InvalidArgumentError(
            f"op must be one of READ, WRITE, CAS, FETCH_ADD, SEND; got {value}", field="op"
        )
    return op


def transaction(m: ub_pb2.UbTransaction) -> Transaction:
    return Transaction(
        op=op_of(m.op),
        dst_eid=m.dst.eid,
        dst_offset=m.dst.offset,
        size=m.size,
        data=m.data,
        size_only=m.size_only,
        compare=m.compare,
        operand=m.operand,
        id=m.id,
        src_eid=m.src_eid,
        src_die=m.src_die,
        src_device=m.src_device,
        issue_ns=m.issue_ns,
        arrive_ns=m.arrive_ns,
    )


def transaction_proto(tx: Transaction, *, check_only: bool = False) -> ub_pb2.UbTransaction:
    return ub_pb2.UbTransaction(
        id=tx.id,
        op=WIRE_OP[tx.op],
        src_eid=tx.src_eid,
        dst=ub_pb2.UbAddress(eid=tx.dst_eid, offset=tx.dst_offset),
        size=tx.size,
        data=tx.data,
        size_only=tx.size_only,
        compare=tx.compare,
        operand=tx.operand,
        issue_ns=tx.issue_ns,
        src_die=tx.src_die,
        check_only=check_only,
        src_device=tx.src_device,
        arrive_ns=tx.arrive_ns,
    )


def completion(m: ub_pb2.UbCompletion) -> Completion:
    return Completion(
        id=m.id,
        op=op_of(m.op),
        src_eid=m.src_eid,
        dst_eid=m.dst_eid,
        size=m.size,
        issue_ns=m.issue_ns,
        complete_ns=m.complete_ns,
        data=m.data,
        old_value=m.old_value,
        swapped=m.swapped,
        path=tuple(m.path),
        planes=m.planes,
    )


def completion_proto(c: Completion) -> ub_pb2.UbCompletion:
    return ub_pb2.UbCompletion(
        id=c.id,
        op=WIRE_OP[c.op],
        src_eid=c.src_eid,
        dst_eid=c.dst_eid,
        size=c.size,
        data=c.data,
        old_value=c.old_value,
        swapped=c.swapped,
        issue_ns=c.issue_ns,
        complete_ns=c.complete_ns,
        path=c.path,
        planes=c.planes,
    )


def message_proto(m: Message) -> ub_pb2.UbMessage:
    return ub_pb2.UbMessage(
        id=m.id,
        src_eid=m.src_eid,
        size=m.size,
        data=m.data,
        size_only=m.size_only,
        issue_ns=m.issue_ns,
        arrive_ns=m.arrive_ns,
        src_device=m.src_device,
    )


def message(m: ub_pb2.UbMessage) -> Message:
    return Message(
        id=m.id,
        src_eid=m.src_eid,
        src_device=m.src_device,
        size=m.size,
        data=m.data,
        size_only=m.size_only,
        issue_ns=m.issue_ns,
        arrive_ns=m.arrive_ns,
    )
