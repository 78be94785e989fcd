"""EMS load on a fixed key space (so the store's size levels off): Put/Get/Delete of real-byte
objects of 1 B .. 4 MiB (over one inline payload by PutStream/GetStream), and now and then a
16..64 MiB object streamed in, read back and deleted. Every read is checked against the ledger,
and every key a read disagreed about is marked for the report of its history."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import grpc

from bench.soak.config import (
    CALL_TIMEOUT_S,
    CHUNK,
    INLINE_MAX,
    KEY_PREFIX,
    MIB,
    STREAM_TIMEOUT_S,
    log_uniform,
)
from bench.soak.context import Soak
from bench.soak.ledger import Objects, Value, describe, holds, said, streamed
from cmemu.v1 import ems_pb2

Got = tuple[bytes, ems_pb2.GetResponse]  # an object's contents, and how it was served


class EmsLoad:
    """The key space, the ledger of its objects, and the single-key operations on them."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.calls = soak.calls
        self.stub = soak.ems
        self.npus = soak.npus
        self.objects = Objects(now=soak.figures.now)
        self.keys = [f"{KEY_PREFIX}k{i:04d}" for i in range(soak.args.keys)]

    def disagree(self, text: str, *keys: str) -> None:
        """A read that disagreed with the ledger about `keys`: counted, and their history kept."""
        self.calls.wrong(text)
        self.objects.bad.update(keys)

    async def put_stream(self, key: str, data: bytes, device: str) -> ems_pb2.PutResponse:
        async def pieces() -> AsyncIterator[ems_pb2.PutChunk]:
            yield ems_pb2.PutChunk(head=ems_pb2.PutRequest(key=key, size=len(data), device=device))
            for start in range(0, len(data), CHUNK):
                yield ems_pb2.PutChunk(data=data[start : start + CHUNK])

        return await self.stub.PutStream(pieces(), timeout=STREAM_TIMEOUT_S)

    async def get_stream(self, key: str, device: str) -> Got:
        parts: list[bytes] = []
        done = ems_pb2.GetResponse()
        async for piece in self.stub.GetStream(
            ems_pb2.GetRequest(key=key, device=device), timeout=STREAM_TIMEOUT_S
        ):
            parts.append(piece.data)
            if piece.HasField("done"):
                done = piece.done
        return b"".join(parts), done

    async def put(self, key: str, data: bytes, device: str, rng: random.Random) -> bool:
        """Put one object into the ledger (the caller holds the key's lock): by Put, or by
        PutStream when over one chunk (and sometimes when not); True when acknowledged."""
        if len(data) <= INLINE_MAX and rng.random() < 0.85:
            kind = rng.choice(
                (
                    ems_pb2.OBJECT_KIND_KV_BLOCK,
                    ems_pb2.OBJECT_KIND_WEIGHTS,
                    ems_pb2.OBJECT_KIND_CHECKPOINT,
                )
            )
            request = ems_pb2.PutRequest(key=key, data=data, device=device, kind=kind)
            done: ems_pb2.PutResponse | grpc.StatusCode = await self.calls.call(
                "ems.put",
                self.stub.Put(request, timeout=CALL_TIMEOUT_S),
                detail=f"{key} {len(data)} B from {device}",
            )
        else:
            done = await self.calls.call(
                "ems.put_stream",
                self.put_stream(key, data, device),
                detail=f"{key} {len(data)} B from {device}",
            )
        if isinstance(done, grpc.StatusCode):
            self.objects.maybe(key, data, f"put {len(data)} B failed {done.name}")
            return False
        where = ",".join(done.replicas)
        self.objects.acknowledged(key, data, f"put {len(data)} B -> {where}")
        if done.size != len(data):
            self.calls.wrong(f"Put of {key}: size {done.size} acknowledged for {len(data)} B")
        return True

    async def get(self, key: str, device: str, rng: random.Random) -> None:
        """Get one object under its lock and check it against the ledger."""
        possible = self.objects.possible(key)
        stream = rng.random() < 0.2 or possible is None or streamed(possible)
        got: Got | grpc.StatusCode
        if stream:
            got = await self.calls.call(
                "ems.get_stream",
                self.get_stream(key, device),
                answers=(grpc.StatusCode.NOT_FOUND,),
                detail=f"{key} to {device}",
            )
        else:
            reply = await self.calls.call(
                "ems.get",
                self.stub.Get(ems_pb2.GetRequest(key=key, device=device), timeout=CALL_TIMEOUT_S),
                answers=(grpc.StatusCode.NOT_FOUND,),
                detail=f"{key} to {device}",
            )
            got = reply if isinstance(reply, grpc.StatusCode) else (reply.data, reply)
        if isinstance(got, grpc.StatusCode):
            self.objects.note(key, f"get {got.name}")
        else:
            self.objects.note(key, f"get {len(got[0])} B from {got[1].served_by}")
        self.check_get(key, possible, got)

    def check_get(self, key: str, possible: list[Value] | None, got: Got | grpc.StatusCode) -> None:
        if possible is None or (isinstance(got, grpc.StatusCode) and got.name != "NOT_FOUND"):
            return
        value = None if isinstance(got, grpc.StatusCode) else got[0]
        if not holds(possible, value):
            self.disagree(f"EMS get of {key}: {said(value)}; ledger has {describe(possible)}", key)

    async def delete(self, key: str) -> ems_pb2.DeleteResponse | grpc.StatusCode:
        """Delete one key in the ledger too (the caller holds its lock)."""
        done = await self.calls.call(
            "ems.delete",
            self.stub.Delete(ems_pb2.DeleteRequest(key=key), timeout=CALL_TIMEOUT_S),
            detail=key,
        )
        if isinstance(done, grpc.StatusCode):
            self.objects.maybe(key, None, f"delete failed {done.name}")
        else:
            self.objects.acknowledged(key, None, f"delete deleted={done.deleted}")
        return done

    async def put_one(self, rng: random.Random) -> None:
        key = rng.choice(self.keys)
        data = rng.randbytes(log_uniform(rng, 1, 4 * MIB))
        async with self.objects.lock(key):
            await self.put(key, data, rng.choice(self.npus).id, rng)

    async def get_one(self, rng: random.Random) -> None:
        key = rng.choice(self.keys)
        async with self.objects.lock(key):
            await self.get(key, rng.choice(self.npus).id, rng)

    async def delete_one(self, rng: random.Random) -> None:
        key = rng.choice(self.keys)
        async with self.objects.lock(key):
            possible = self.objects.possible(key)
            done = await self.delete(key)
            if isinstance(done, grpc.StatusCode):
                return
            if (
                possible is not None
                and len(possible) == 1
                and done.deleted != (possible[0] is not None)
            ):
                self.disagree(
                    f"EMS delete of {key}: deleted={done.deleted}, ledger {possible}", key
                )

    async def big_object(self, rng: random.Random) -> None:
        """A 16..64 MiB object of real bytes: PutStream, GetStream from another NPU, Delete."""
        figures = self.soak.figures
        key = f"{KEY_PREFIX}big{figures.big_objects:03d}"
        figures.big_objects += 1
        data = rng.randbytes(rng.randint(16 * MIB, 64 * MIB))
        async with self.objects.lock(key):
            if await self.put(key, data, rng.choice(self.npus).id, rng):
                await self.get(key, rng.choice(self.npus).id, rng)
            await self.delete(key)
