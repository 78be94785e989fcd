"""SENDs with unique ids and payloads (real bytes or size-only), drained by Receive: lost,
corrupted or duplicated messages, and inboxes that only grow."""

from __future__ import annotations

import random

import grpc

from bench.soak.config import CALL_TIMEOUT_S, KIB, MIB, log_uniform
from bench.soak.context import Soak
from bench.soak.ledger import Sends
from cmemu.v1 import ub_pb2


class MessageLoad:
    """SENDs and Receives, with the ledger of the messages in flight."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.calls = soak.calls
        self.sends = Sends()

    async def send(self, rng: random.Random) -> None:
        dst = rng.choice(self.soak.all_devices)
        src, die = self.soak.issuer(rng)
        ident = self.soak.serial_id("soak-m")
        if rng.random() < 0.8:
            data, size_only = rng.randbytes(log_uniform(rng, 1, 16 * KIB)), 0
            tx = ub_pb2.UbTransaction(
                id=ident, op=ub_pb2.UB_OP_SEND, dst=ub_pb2.UbAddress(eid=dst.eid), data=data
            )
        else:
            data, size_only = b"", log_uniform(rng, 1, 64 * MIB)
            tx = ub_pb2.UbTransaction(
                id=ident,
                op=ub_pb2.UB_OP_SEND,
                dst=ub_pb2.UbAddress(eid=dst.eid),
                size=size_only,
                size_only=True,
            )
        tx.src_die = die
        self.sends.mailboxes.add(dst.id)
        self.sends.expected[ident] = (dst.id, data, size_only)  # from now on it may arrive
        done = await self.calls.call(
            "ub.send", self.soak.submit(src, tx), detail=f"{src} -> {dst.id}"
        )
        if isinstance(done, grpc.StatusCode):
            return
        if ident in self.sends.expected:  # not drained already by another task
            self.sends.acked.add(ident)
        await self.receive(dst.id)

    async def receive(self, device: str, wait_ms: int = 0) -> int:
        """Drain up to one batch of `device`'s inbox into the ledger: the messages taken."""
        got = await self.calls.call(
            "ub.receive",
            self.soak.clients.bus(device).Receive(
                ub_pb2.ReceiveRequest(max_messages=1024, wait_ms=wait_ms), timeout=CALL_TIMEOUT_S
            ),
            detail=device,
        )
        if isinstance(got, grpc.StatusCode):
            return 0
        for message in got.messages:
            expected = self.sends.expected.pop(message.id, None)
            self.sends.acked.discard(message.id)
            if expected is None:  # a duplicate, or never sent
                self.soak.figures.unexpected_messages += 1
                continue
            dst, data, size_only = expected
            ok = dst == device and (
                (message.size_only and message.size == size_only)
                if size_only
                else message.data == data
            )
            if not ok:
                self.calls.wrong(f"SEND {message.id} to {dst} arrived at {device} altered")
        return len(got.messages)
