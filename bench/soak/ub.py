"""UB load on memory the soak owns: real-byte writes and reads of data regions (the sparse byte
store under churn), CAS and FETCH_ADD on counter words (lost or doubled atomics), and size-only
bulk transfers into big regions (the fabric's flow model under large flows, no bytes held)."""

from __future__ import annotations

import random

import grpc
import numpy as np

from bench.soak.config import (
    BULK_REGION_BYTES,
    BULK_REGIONS,
    COUNTER_REGIONS,
    DATA_REGION_BYTES,
    DATA_REGIONS,
    GIB,
    KIB,
    MIB,
    U64,
    WORDS_PER_REGION,
    log_uniform,
)
from bench.soak.context import Soak
from bench.soak.ledger import Region, Word
from cmemu.v1 import device_pb2, ub_pb2


class UbLoad:
    """The data regions, counters and bulk regions, and the operations on them."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.calls = soak.calls
        self.regions: list[Region] = []
        self.words: list[Word] = []
        self.bulk: list[ub_pb2.UbAddress] = []

    async def setup(self) -> None:
        """Regions, counters and bulk regions, and every data region filled with random bytes
        (acknowledged: all of it is in the ledger from the start)."""
        soak, rng = self.soak, self.soak.rng
        for kind, count in DATA_REGIONS.items():
            for device in rng.sample(soak.topology.of_kind(kind), count):
                region = await soak.clients.device(device.id).AllocateRegion(
                    device_pb2.AllocateRegionRequest(size=DATA_REGION_BYTES, label="soak-data")
                )
                content = np.frombuffer(bytearray(rng.randbytes(DATA_REGION_BYTES)), np.uint8)
                self.regions.append(
                    Region(
                        device=device.id,
                        eid=region.eid,
                        offset=region.offset,
                        size=DATA_REGION_BYTES,
                        shadow=content,
                        known=np.ones(DATA_REGION_BYTES, np.bool_),
                    )
                )
        for data in self.regions:
            writer = rng.choice(soak.all_devices).id
            for start in range(0, data.size, 64 * KIB):
                await soak.clients.bus(writer).Submit(
                    ub_pb2.UbTransaction(
                        op=ub_pb2.UB_OP_WRITE,
                        dst=data.address(start),
                        data=data.shadow[start : start + 64 * KIB].tobytes(),
                    )
                )
        for device in rng.sample(soak.all_devices, COUNTER_REGIONS):
            region = await soak.clients.device(device.id).AllocateRegion(
                device_pb2.AllocateRegionRequest(size=4096, label="soak-counters")
            )
            for slot in rng.sample(range(4096 // 8), WORDS_PER_REGION):
                word = Word(device.id, region.eid, region.offset + 8 * slot, {0})
                await soak.clients.bus(device.id).Submit(
                    ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=word.address(), data=bytes(8))
                )
                self.words.append(word)
        for device in rng.sample(soak.npus, BULK_REGIONS):
            region = await soak.clients.device(device.id).AllocateRegion(
                device_pb2.AllocateRegionRequest(size=BULK_REGION_BYTES, label="soak-bulk")
            )
            self.bulk.append(ub_pb2.UbAddress(eid=region.eid, offset=region.offset))

    async def write(self, rng: random.Random) -> None:
        region = rng.choice(self.regions)
        size = log_uniform(rng, 1, 64 * KIB)
        at = rng.randrange(region.size - size + 1)
        data = rng.randbytes(size)
        src, die = self.soak.issuer(rng)
        async with region.lock:
            done = await self.calls.call(
                "ub.write",
                self.soak.submit(
                    src,
                    ub_pb2.UbTransaction(
                        op=ub_pb2.UB_OP_WRITE, dst=region.address(at), data=data, src_die=die
                    ),
                ),
                detail=f"{src} -> {region.device} +{at} {size} B",
            )
            if isinstance(done, grpc.StatusCode):
                region.known[at : at + size] = False  # applied or not: unknown until rewritten
                return
            region.shadow[at : at + size] = np.frombuffer(data, np.uint8)
            region.known[at : at + size] = True

    async def read(self, rng: random.Random) -> None:
        region = rng.choice(self.regions)
        size = log_uniform(rng, 1, 256 * KIB)
        at = rng.randrange(region.size - size + 1)
        src, die = self.soak.issuer(rng)
        async with region.lock:
            done = await self.calls.call(
                "ub.read",
                self.soak.submit(
                    src,
                    ub_pb2.UbTransaction(
                        op=ub_pb2.UB_OP_READ, dst=region.address(at), size=size, src_die=die
                    ),
                ),
                detail=f"{src} <- {region.device} +{at} {size} B",
            )
            if isinstance(done, grpc.StatusCode):
                return
            bad = region.differing(at, done.data, size)
            if bad:
                self.calls.wrong(
                    f"UB read by {src} of {region.device} (EID {region.eid}) offset "
                    f"{region.offset + at} size {size}: {bad} known bytes differ"
                )

    async def atomic(self, rng: random.Random) -> None:
        word = rng.choice(self.words)
        src, die = self.soak.issuer(rng)
        async with word.lock:
            dst = word.address()
            if rng.random() < 0.5:
                operand = rng.randrange(1, 2**32)
                tx = ub_pb2.UbTransaction(
                    op=ub_pb2.UB_OP_FETCH_ADD, dst=dst, operand=operand, src_die=die
                )

                def apply(v: int) -> int:
                    return (v + operand) % U64
            else:
                known = sorted(word.possible) if word.possible else [0]
                compare = rng.choice(known) if rng.random() < 0.8 else rng.randrange(U64)
                operand = rng.randrange(U64)
                tx = ub_pb2.UbTransaction(
                    op=ub_pb2.UB_OP_CAS, dst=dst, compare=compare, operand=operand, src_die=die
                )

                def apply(v: int) -> int:
                    return operand if v == compare else v

            name = "ub.fetch_add" if tx.op == ub_pb2.UB_OP_FETCH_ADD else "ub.cas"
            done = await self.calls.call(
                name, self.soak.submit(src, tx), detail=f"{src} -> {word.device} +{word.offset}"
            )
            if isinstance(done, grpc.StatusCode):
                word.maybe(apply)
                return
            if word.possible is not None and done.old_value not in word.possible:
                self.calls.wrong(
                    f"{name} by {src} on {word.device} (EID {word.eid}) offset {word.offset}: "
                    f"old value {done.old_value}, expected one of {sorted(word.possible)}"
                )
            if tx.op == ub_pb2.UB_OP_CAS and done.swapped != (done.old_value == tx.compare):
                self.calls.wrong(
                    f"CAS on {word.device}: swapped={done.swapped}, old={done.old_value}"
                )
            word.possible = {apply(done.old_value)}

    async def bulk_transfer(self, rng: random.Random) -> None:
        dst = rng.choice(self.bulk)
        size = log_uniform(rng, MIB, 2 * GIB)
        at = rng.randrange(0, BULK_REGION_BYTES - size + 1, 4096)
        op = rng.choice((ub_pb2.UB_OP_WRITE, ub_pb2.UB_OP_READ))
        src, die = self.soak.issuer(rng)
        await self.calls.call(
            "ub.bulk_write" if op == ub_pb2.UB_OP_WRITE else "ub.bulk_read",
            self.soak.submit(
                src,
                ub_pb2.UbTransaction(
                    op=op,
                    dst=ub_pb2.UbAddress(eid=dst.eid, offset=dst.offset + at),
                    size=size,
                    size_only=True,
                    src_die=die,
                ),
            ),
            detail=f"{src} EID {dst.eid} {size} B",
        )
