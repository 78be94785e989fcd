"""The elastic memory store (EMS) of a running emulator as a program (or `cmemu ems`) calls it:
put, get, stat, list, delete and exists (and the batch and prefix calls the serving router makes),
with plain values in and out.

A put of more real bytes than one chunk goes by PutStream, a get always by GetStream (so any
object reads back whatever its size); both are all or nothing on the server. Every failure is
the EmulatorError its status names, the server's message unprefixed (emulator/client/status.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import error_from, reply_of
from cmemu.emulator.model.ems.index import Tier
from cmemu.emulator.model.ems.objects import Got as Got  # noqa: PLC0414
from cmemu.emulator.model.ems.objects import ObjectKind as ObjectKind  # noqa: PLC0414
from cmemu.emulator.model.ems.objects import PrefixMatch as PrefixMatch  # noqa: PLC0414
from cmemu.emulator.model.ems.objects import Put as Put  # noqa: PLC0414
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind
from cmemu.v1 import ems_pb2, ems_pb2_grpc

CHUNK = DEFAULT_PROFILE.ems.chunk_bytes  # a Put's most real bytes, and a PutStream piece


WIRE_KIND = {
    ObjectKind.KV: ems_pb2.OBJECT_KIND_KV_BLOCK,
    ObjectKind.WEIGHTS: ems_pb2.OBJECT_KIND_WEIGHTS,
    ObjectKind.CHECKPOINT: ems_pb2.OBJECT_KIND_CHECKPOINT,
}
KIND_OF = {wire: kind for kind, wire in WIRE_KIND.items()}
TIER_OF = {ems_pb2.TIER_DRAM: Tier.DRAM, ems_pb2.TIER_SSD: Tier.SSD}


@dataclass(frozen=True, kw_only=True)
class ObjectInfo:
    key: str
    size: int
    kind: ObjectKind
    pinned: bool
    tier: Tier | None  # None: a tier this client does not know
    replicas: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PoolStat:
    pool: str
    healthy: bool
    objects: int
    bytes: int
    capacity_bytes: int


@dataclass(frozen=True, kw_only=True)
class EmsStat:
    """The store's use (see cmemu.v1.StatResponse for each figure)."""

    objects: int
    dram_bytes: int
    dram_capacity_bytes: int
    dram_used_bytes: int
    ssd_objects: int
    ssd_used_bytes: int
    ssd_capacity_bytes: int
    replication_factor: int
    under_replicated: int
    hits: int
    misses: int
    evictions: int
    corrupt_copies: int
    pools: tuple[PoolStat, ...]
    recovering: bool  # rebuilding its index: calls about keys answer UNAVAILABLE RECOVERING
    pools_listed: int
    pools_total: int


class EmsClient:
    """The EMS of `clients`' supernode, over its channels (not closed here: the caller owns
    them)."""

    def __init__(
        self, clients: Clients | grpc.aio.Channel, *, timeout_s: float | None = None
    ) -> None:
        """`clients`' EMS, or the one at the other end of a channel (a service's own, shared
        channel: services/peers.py). `timeout_s`: every call's wall deadline (None: none), for
        a caller that must go on when the service hangs (the chaos runner's status polls)."""
        self._timeout_s = timeout_s
        if isinstance(clients, grpc.aio.Channel):
            channel = clients
        else:
            channel = clients.channel_to(clients.topology.service(ServiceKind.EMS).address)
        self._stub = ems_pb2_grpc.EmsStub(channel)

    async def put(
        self,
        key: str,
        data: bytes = b"",
        *,
        size: int = 0,
        kind: ObjectKind = ObjectKind.KV,
        pinned: bool = False,
        device: str = "",
    ) -> Put:
        """Store real `data`, or (no data) a size-only object of `size` bytes."""
        if data and size not in (0, len(data)):
            raise InvalidArgumentError(
                f"size {size} differs from len(data) {len(data)}", field="size"
            )
        head = ems_pb2.PutRequest(key=key, kind=WIRE_KIND[kind], pinned=pinned, device=device)
        if len(data) > CHUNK:
            head.size = len(data)
            return _put(
                await reply_of(
                    None, self._stub.PutStream(_chunks(head, data), timeout=self._timeout_s)
                )
            )
        if data:
            head.data = data
        else:
            head.size = size
        return _put(await reply_of(None, self._stub.Put(head, timeout=self._timeout_s)))

    async def get(self, key: str, *, device: str = "", keep_data: bool = True) -> Got:
        """An object's bytes (dropped as they come when not `keep_data`) and its timing."""
        parts: list[bytes] = []
        done = ems_pb2.GetResponse()
        stream = self._stub.GetStream(
            ems_pb2.GetRequest(key=key, device=device), timeout=self._timeout_s
        )
        try:
            async for chunk in stream:
                if keep_data:
                    parts.append(chunk.data)
                if chunk.HasField("done"):
                    done = chunk.done
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc) from None
        finally:
            stream.cancel()
        return Got(
            key=done.key,
            data=b"".join(parts),
            size=done.size,
            served_by=done.served_by,
            issue_ns=done.issue_ns,
            complete_ns=done.complete_ns,
        )

    async def load(self, key: str, *, device: str = "") -> Got:
        """An object read in one call, into `device` (a serving NPU loading a weights shard, a
        training NPU its checkpoint shard: the EMS times the transfer to it; "": none). Its
        bytes come too, for an object of at most one chunk (a size-only object has none)."""
        request = ems_pb2.GetRequest(key=key, device=device)
        m = await reply_of(None, self._stub.Get(request, timeout=self._timeout_s))
        return Got(
            key=m.key,
            data=m.data,
            size=m.size,
            served_by=m.served_by,
            issue_ns=m.issue_ns,
            complete_ns=m.complete_ns,
        )

    async def put_sizes(
        self, keys: Sequence[str], *, size: int, kind: ObjectKind, device: str = ""
    ) -> list[Put]:
        """Size-only objects of `size` bytes each, in one call (a prompt's new KV blocks)."""
        items = [
            ems_pb2.PutRequest(key=k, size=size, kind=WIRE_KIND[kind], device=device) for k in keys
        ]
        request = ems_pb2.BatchPutRequest(items=items)
        reply = await reply_of(None, self._stub.BatchPut(request, timeout=self._timeout_s))
        return [_put(m) for m in reply.items]

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Remove objects in one call (one already gone is no error)."""
        request = ems_pb2.BatchDeleteRequest(keys=list(keys))
        await reply_of(None, self._stub.BatchDelete(request, timeout=self._timeout_s))

    async def exist(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored, in one call, in the order asked."""
        request = ems_pb2.BatchExistsRequest(keys=list(keys))
        reply = await reply_of(None, self._stub.BatchExists(request, timeout=self._timeout_s))
        return list(reply.exists)

    async def match_prefix(
        self, tokens: Sequence[int], *, block_tokens: int, namespace: str = ""
    ) -> PrefixMatch:
        """How much of a prompt's prefix EMS holds the KV blocks of."""
        request = ems_pb2.PrefixRequest(
            tokens=tokens, block_tokens=block_tokens, namespace=namespace
        )
        m = await reply_of(None, self._stub.MatchPrefix(request, timeout=self._timeout_s))
        return PrefixMatch(
            matched_blocks=m.matched_blocks, matched_tokens=m.matched_tokens, keys=tuple(m.keys)
        )

    async def stat(self, pool: str = "") -> EmsStat:
        """The store's use; with `pool`, that memory pool's only."""
        return _stat(
            await reply_of(
                None, self._stub.Stat(ems_pb2.StatRequest(pool=pool), timeout=self._timeout_s)
            )
        )

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every stored object whose key starts with `prefix`, in key order (all pages)."""
        found: list[ObjectInfo] = []
        token = ""
        while True:
            request = ems_pb2.ListRequest(prefix=prefix, page_token=token)
            page = await reply_of(None, self._stub.List(request, timeout=self._timeout_s))
            found.extend(_info(o) for o in page.objects)
            token = page.next_page_token
            if not token:
                return found

    async def delete(self, key: str) -> bool:
        """Remove an object: whether there was one."""
        reply = await reply_of(
            None, self._stub.Delete(ems_pb2.DeleteRequest(key=key), timeout=self._timeout_s)
        )
        return bool(reply.deleted)

    async def exists(self, key: str) -> bool:
        reply = await reply_of(
            None, self._stub.Exists(ems_pb2.ExistsRequest(key=key), timeout=self._timeout_s)
        )
        return bool(reply.exists)


async def _chunks(head: ems_pb2.PutRequest, data: bytes) -> AsyncIterator[ems_pb2.PutChunk]:
    yield ems_pb2.PutChunk(head=head)
    for start in range(0, len(data), CHUNK):
        yield ems_pb2.PutChunk(data=data[start : start + CHUNK])


def _put(m: ems_pb2.PutResponse) -> Put:
    return Put(
        key=m.key,
        size=m.size,
        replicas=tuple(m.replicas),
        issue_ns=m.issue_ns,
        complete_ns=m.complete_ns,
        evicted=m.evicted,
    )


def _info(o: ems_pb2.ObjectInfo) -> ObjectInfo:
    return ObjectInfo(
        key=o.key,
        size=o.size,
        kind=KIND_OF.get(o.kind, ObjectKind.KV),
        pinned=o.pinned,
        tier=TIER_OF.get(o.tier),
        replicas=tuple(o.replicas),
    )


def _stat(m: ems_pb2.StatResponse) -> EmsStat:
    return EmsStat(
        objects=m.objects,
        dram_bytes=m.dram_bytes,
        dram_capacity_bytes=m.dram_capacity_bytes,
        dram_used_bytes=m.dram_used_bytes,
        ssd_objects=m.ssd_objects,
        ssd_used_bytes=m.ssd_used_bytes,
        ssd_capacity_bytes=m.ssd_capacity_bytes,
        replication_factor=m.replication_factor,
        under_replicated=m.under_replicated,
        hits=m.hits,
        misses=m.misses,
        evictions=m.evictions,
        corrupt_copies=m.corrupt_copies,
        pools=tuple(
            PoolStat(
                pool=p.pool,
                healthy=p.healthy,
                objects=p.objects,
                bytes=p.bytes,
                capacity_bytes=p.capacity_bytes,
            )
            for p in m.pools
        ),
        recovering=m.recovering,
        pools_listed=m.pools_listed,
        pools_total=m.pools_total,
    )
