"""Unified-bus transactions between devices, over real gRPC against an in-process cm-mini."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cmemu.emulator.model.costmodel import UbOp, ub_point, ub_transfer_ns
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.testing import Clients
from cmemu.v1 import device_pb2, ub_pb2

LIMITS = DEFAULT_PROFILE.limits


async def _region(clients: Clients, device_id: str, size: int = 1 << 16) -> ub_pb2.UbAddress:
    region = await clients.device(device_id).AllocateRegion(
        device_pb2.AllocateRegionRequest(size=size, label="test")
    )
    return ub_pb2.UbAddress(eid=region.eid, offset=region.offset)


async def _status(clients: Clients, src: str, tx: ub_pb2.UbTransaction) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.bus(src).Submit(tx)
    assert await clients.health(src) == "SERVING"  # the issuer keeps serving after each refusal
    return err.value.code().name


async def test_write_real_bytes_into_another_device_and_read_them_back(clients: Clients) -> None:
    dst = await _region(clients, "n00-npu2")
    payload = bytes(range(256)) * 20 + b"tail"
    write = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, data=payload, id="w1")
    done = await clients.bus("n00-npu0").Submit(write)
    assert done.id == "w1" and done.size == len(payload)
    assert list(done.path) == ["n00-npu0.d0", "n00-l1s0", "n00-npu2.d0"]
    assert done.planes == 7
    expected = ub_transfer_ns(
        len(payload), src=DeviceKind.NPU, dst=DeviceKind.NPU, cross_node=False, op=UbOp.WRITE
    )
    assert done.complete_ns - done.issue_ns == expected
    # read from a device of the other node: exactly the bytes written
    read = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=len(payload))
    got = await clients.bus("n01-npu6").Submit(read)
    assert got.data == payload
    assert got.src_eid == clients.topology.device("n01-npu6").eid
    assert len(got.path) == 5 and got.path[2].startswith("l2-p0-")  # L1, L2, L1: one plane shown
    cross = ub_transfer_ns(len(payload), src=DeviceKind.NPU, dst=DeviceKind.NPU, cross_node=True)
    assert got.complete_ns - got.issue_ns == cross > expected
    # a part of it, at an offset
    part = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=dst.eid, offset=dst.offset + 250), size=10
    )
    assert (await clients.bus("n00-cpu3").Submit(part)).data == payload[250:260]


async def test_any_device_reads_and_writes_a_memory_pool(clients: Clients) -> None:
    dst = await _region(clients, "n01-mem", 1 << 20)
    for src in ("n00-npu4", "n01-cpu0", "n00-mem"):
        data = src.encode() * 10
        await clients.bus(src).Submit(
            ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, data=data)
        )
        back = await clients.bus("n01-npu1").Submit(
            ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=len(data))
        )
        assert back.data == data


async def test_bulk_transfers_are_size_only(clients: Clients) -> None:
    dst = await _region(clients, "n01-npu2", 1 << 30)
    bulk = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, size=1 << 30, size_only=True)
    done = await clients.bus("n00-npu0").Submit(bulk)
    bandwidth = (1 << 30) / ((done.complete_ns - done.issue_ns) / 1e9)
    write = ub_point(UbOp.WRITE, DeviceKind.NPU).bytes_per_s  # 137 GB/s of one die's writes
    assert 0.97 * write < bandwidth < write  # cross-node: a little under it
    back = await clients.bus("n00-npu0").Submit(
        ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=1 << 30, size_only=True)
    )
    assert back.size == 1 << 30 and back.data == b""


async def test_atomics(clients: Clients) -> None:
    dst = await _region(clients, "n00-mem")
    bus = clients.bus("n00-npu3")

    def faa(n: int) -> ub_pb2.UbTransaction:
        return ub_pb2.UbTransaction(op=ub_pb2.UB_OP_FETCH_ADD, dst=dst, operand=n)

    olds = await asyncio.gather(*(bus.Submit(faa(1)) for _ in range(50)))
    assert sorted(c.old_value for c in olds) == list(range(50))  # no lost update
    cas = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_CAS, dst=dst, compare=50, operand=7)
    first = await bus.Submit(cas)
    assert (first.old_value, first.swapped) == (50, True)
    second = await bus.Submit(cas)
    assert (second.old_value, second.swapped) == (7, False)
    word = await bus.Submit(ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=8))
    assert int.from_bytes(word.data, "little") == 7


async def test_send_and_receive(clients: Clients) -> None:
    target = clients.topology.device("n01-cpu3")
    waiter = asyncio.ensure_future(
        clients.bus(target.id).Receive(ub_pb2.ReceiveRequest(max_messages=10, wait_ms=5000))
    )
    await asyncio.sleep(0.05)
    send = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=target.eid), data=b"hello", id="m1"
    )
    await clients.bus("n00-npu7").Submit(send)
    got = await waiter
    assert [(m.id, m.data, m.src_eid) for m in got.messages] == [
        ("m1", b"hello", clients.topology.device("n00-npu7").eid)
    ]
    assert got.messages[0].arrive_ns > got.messages[0].issue_ns
    empty = await clients.bus(target.id).Receive(ub_pb2.ReceiveRequest(wait_ms=10))
    assert not empty.messages


async def test_a_full_receive_queue_refuses_and_keeps_what_it_acknowledged(
    clients: Clients,
) -> None:
    target = clients.topology.device("n01-cpu2")
    bus = clients.bus("n00-cpu1")

    def send(i: int) -> ub_pb2.UbTransaction:
        return ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=target.eid), data=i.to_bytes(4, "big")
        )

    for start in range(0, LIMITS.inbox_max_messages, 128):
        await asyncio.gather(*(bus.Submit(send(i)) for i in range(start, start + 128)))
    assert (
        await _status(clients, "n00-cpu1", send(LIMITS.inbox_max_messages)) == "RESOURCE_EXHAUSTED"
    )
    received: list[int] = []
    while len(received) < LIMITS.inbox_max_messages:
        batch = await clients.bus(target.id).Receive(
            ub_pb2.ReceiveRequest(max_messages=LIMITS.inbox_max_messages)
        )
        received += [int.from_bytes(m.data, "big") for m in batch.messages]
    assert sorted(received) == list(range(LIMITS.inbox_max_messages))  # none lost


async def test_bad_transactions_get_precise_statuses(clients: Clients) -> None:
    dst = await _region(clients, "n00-npu6", 4096)
    npu = clients.topology.device("n00-npu6")
    capacity = DEFAULT_PROFILE.npu.hbm_bytes
    write = ub_pb2.UB_OP_WRITE
    read = ub_pb2.UB_OP_READ
    cases = {
        "unknown EID": (
            ub_pb2.UbTransaction(op=read, dst=ub_pb2.UbAddress(eid=99999), size=8),
            "NOT_FOUND",
        ),
        "unset EID": (ub_pb2.UbTransaction(op=read, size=8), "INVALID_ARGUMENT"),
        "no op": (ub_pb2.UbTransaction(dst=dst, size=8), "INVALID_ARGUMENT"),
        "unknown op": (ub_pb2.UbTransaction(op=99, dst=dst, size=8), "INVALID_ARGUMENT"),  # type: ignore[arg-type]
        "zero size": (ub_pb2.UbTransaction(op=read, dst=dst), "INVALID_ARGUMENT"),
        "past the memory": (
            ub_pb2.UbTransaction(
                op=read, dst=ub_pb2.UbAddress(eid=npu.eid, offset=capacity), size=8
            ),
            "OUT_OF_RANGE",
        ),
        "straddles the end": (
            ub_pb2.UbTransaction(
                op=read, dst=ub_pb2.UbAddress(eid=npu.eid, offset=capacity - 4), size=8
            ),
            "OUT_OF_RANGE",
        ),
        "not allocated": (
            ub_pb2.UbTransaction(
                op=read, dst=ub_pb2.UbAddress(eid=npu.eid, offset=1 << 36), size=8
            ),
            "FAILED_PRECONDITION",
        ),
        "size disagrees with data": (
            ub_pb2.UbTransaction(op=write, dst=dst, data=b"abc", size=4),
            "INVALID_ARGUMENT",
        ),
        "write without payload": (
            ub_pb2.UbTransaction(op=write, dst=dst, size=4),
            "INVALID_ARGUMENT",
        ),
        "data and size_only": (
            ub_pb2.UbTransaction(op=write, dst=dst, data=b"abc", size_only=True),
            "INVALID_ARGUMENT",
        ),
        "read carrying data": (
            ub_pb2.UbTransaction(op=read, dst=dst, data=b"abc"),
            "INVALID_ARGUMENT",
        ),
        "inline read too large": (
            ub_pb2.UbTransaction(op=read, dst=dst, size=LIMITS.inline_payload_max_bytes + 1),
            "INVALID_ARGUMENT",
        ),
        "misaligned atomic": (
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_FETCH_ADD,
                dst=ub_pb2.UbAddress(eid=dst.eid, offset=dst.offset + 4),
                operand=1,
            ),
            "INVALID_ARGUMENT",
        ),
        "atomic with payload": (
            ub_pb2.UbTransaction(op=ub_pb2.UB_OP_CAS, dst=dst, data=b"12345678"),
            "INVALID_ARGUMENT",
        ),
        "send to unknown device": (
            ub_pb2.UbTransaction(op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=5), data=b"x"),
            "NOT_FOUND",
        ),
    }
    for name, (tx, code) in cases.items():
        assert await _status(clients, "n00-npu5", tx) == code, name


async def test_refusals_lose_nothing_acknowledged(clients: Clients) -> None:
    dst = await _region(clients, "n01-npu7", 8192)
    await clients.bus("n00-npu1").Submit(
        ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, data=b"keep me")
    )
    straddle = ub_pb2.UbTransaction(
        op=ub_pb2.UB_OP_WRITE,
        dst=ub_pb2.UbAddress(eid=dst.eid, offset=dst.offset + 8190),
        data=b"overflowing",
    )
    assert await _status(clients, "n00-npu1", straddle) == "FAILED_PRECONDITION"
    back = await clients.bus("n00-npu1").Submit(
        ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=7)
    )
    assert back.data == b"keep me"


async def test_deliver_refuses_a_transaction_for_another_device(clients: Clients) -> None:
    other = clients.topology.device("n00-npu1")
    tx = ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=other.eid), size=8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await clients.bus("n00-npu0").Deliver(tx)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_receive_arguments_are_checked(clients: Clients) -> None:
    bus = clients.bus("n00-npu0")
    for request in (
        ub_pb2.ReceiveRequest(max_messages=LIMITS.inbox_max_messages + 1),
        ub_pb2.ReceiveRequest(wait_ms=10**6),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bus.Receive(request)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
