"""The EMS service: the elastic memory store over the nodes' memory pools.

Protobuf in, the store (emulator/engines/ems/, over the model in emulator/model/ems) in between,
protobuf out; domain errors become statuses through `rpc`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.ems import EmsState, Fetched, Stored
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.model.ems import ObjectMeta, Tier, check_key, object_size
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError, NotFoundError
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Topology
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers
from cmemu.services.rpc import Context, abort, rpc
from cmemu.v1 import ems_pb2, ems_pb2_grpc

__all__ = ["SERVICE", "EmsServicer", "EmsState", "create_ems"]

SERVICE = "cmemu.v1.Ems"
TIERS: dict[Tier, ems_pb2.Tier.ValueType] = {
    Tier.DRAM: ems_pb2.TIER_DRAM,
    Tier.SSD: ems_pb2.TIER_SSD,
}


def _kind(meta: ObjectMeta) -> ems_pb2.ObjectKind.ValueType:
    return cast(ems_pb2.ObjectKind.ValueType, meta.kind)


def _got(f: Fetched) -> ems_pb2.GetResponse:
    meta = f.meta
    return ems_pb2.GetResponse(
        key=meta.key,
        data=f.data,
        size=meta.size,
        kind=_kind(meta),
        tier=TIERS[meta.tier],
        served_by=f.served_by,
        corrupt_copies=f.corrupt_copies,
        issue_ns=f.issue_ns,
        complete_ns=f.complete_ns,
    )


def _stored(stored: Stored) -> ems_pb2.PutResponse:
    return ems_pb2.PutResponse(
        key=stored.meta.key,
        size=stored.meta.size,
        replicas=stored.replicas,
        issue_ns=stored.timing.issue_ns,
        complete_ns=stored.timing.complete_ns,
        evicted=stored.evicted,
    )


class EmsServicer(ems_pb2_grpc.EmsServicer):
    def __init__(self, state: EmsState) -> None:
        self.state = state

    def _item(
        self, request: ems_pb2.PutRequest, data: bytes, *, streamed: bool = False
    ) -> tuple[ObjectMeta, bytes, str]:
        meta = self.state.new_object(
            request.key, len(data), size=request.size, kind=request.kind,
            device=request.device, pinned=request.pinned, streamed=streamed,
        )  # fmt: skip
        return meta, data, request.device

    async def _put(self, request: ems_pb2.PutRequest) -> ems_pb2.PutResponse:
        meta, data, device = self._item(request, request.data)
        return _stored(await self.state.put(meta, data, device))

    def _exists(self, key: str) -> ems_pb2.ExistsResponse:
        meta = self.state.lookup(key)
        if meta is None:
            return ems_pb2.ExistsResponse(exists=False)
        return ems_pb2.ExistsResponse(exists=True, size=meta.size, tier=TIERS[meta.tier])

    @rpc
    async def Put(self, request: ems_pb2.PutRequest, context: Context) -> ems_pb2.PutResponse:
        return await self._put(request)

    @rpc
    async def Get(self, request: ems_pb2.GetRequest, context: Context) -> ems_pb2.GetResponse:
        return _got(await self.state.get(request.key, request.device, self.state.ems.chunk_bytes))

    @rpc
    async def PutStream(
        self, request_iterator: AsyncIterator[ems_pb2.PutChunk], context: Context
    ) -> ems_pb2.PutResponse:
        head: ems_pb2.PutRequest | None = None
        parts: list[bytes] = []
        total = 0
        async for chunk in request_iterator:
            if head is None:
                if not chunk.HasField("head"):
                    raise InvalidArgumentError(
                        "the first message of a PutStream carries head", field="head"
                    )
                head = chunk.head
                check_key(head.key)
                object_size(head.size, 0, self.state.ems, streamed=True)
                parts.append(head.data)
                total = len(head.data)
            elif chunk.HasField("head"):
                raise InvalidArgumentError("only the first message carries head", field="head")
            parts.append(chunk.data)
            total += len(chunk.data)
            if total > head.size:
                raise InvalidArgumentError(
                    f"more bytes than head.size ({head.size})", field="data", subject=head.key
                )
        if head is None:
            raise InvalidArgumentError("an empty PutStream", field="head")
        if total != head.size:
            raise InvalidArgumentError(
                f"the stream ended after {total} of head.size {head.size} bytes", field="data"
            )
        meta, data, device = self._item(head, b"".join(parts), streamed=True)
        return _stored(await self.state.put(meta, data, device))

    async def GetStream(
        self, request: ems_pb2.GetRequest, context: Context
    ) -> AsyncIterator[ems_pb2.GetChunk]:
        try:
            reading = await self.state.read(request.key, request.device)
            offset = 0
            async for piece in reading.chunks():
                yield ems_pb2.GetChunk(data=piece, offset=offset)
                offset += len(piece)
        except EmulatorError as exc:
            await abort(context, exc)
        meta = reading.meta
        yield ems_pb2.GetChunk(
            offset=offset,
            done=ems_pb2.GetResponse(
                key=meta.key,
                size=meta.size,
                kind=_kind(meta),
                tier=TIERS[meta.tier],
                served_by=reading.served_by,
                corrupt_copies=reading.corrupt_copies,
                issue_ns=reading.issue_ns,
                complete_ns=reading.complete_ns,
            ),
        )

    @rpc
    async def Delete(
        self, request: ems_pb2.DeleteRequest, context: Context
    ) -> ems_pb2.DeleteResponse:
        return ems_pb2.DeleteResponse(deleted=await self.state.delete(request.key))

    @rpc
    async def Exists(
        self, request: ems_pb2.ExistsRequest, context: Context
    ) -> ems_pb2.ExistsResponse:
        return self._exists(request.key)

    @rpc
    async def BatchPut(
        self, request: ems_pb2.BatchPutRequest, context: Context
    ) -> ems_pb2.BatchPutResponse:
        items = [self._item(item, item.data) for item in request.items]
        keys = [meta.key for meta, _, _ in items]
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError("a key appears twice in one batch", field="items")
        stored = await self.state.put_all(items)
        return ems_pb2.BatchPutResponse(items=[_stored(s) for s in stored])

    @rpc
    async def BatchGet(
        self, request: ems_pb2.BatchGetRequest, context: Context
    ) -> ems_pb2.BatchGetResponse:
        reply = ems_pb2.BatchGetResponse()
        for item in request.items:
            try:
                got = await self.state.get(item.key, item.device, self.state.ems.chunk_bytes)
                reply.items.append(_got(got))
            except NotFoundError:
                reply.missing.append(item.key)
        return reply

    @rpc
    async def BatchDelete(
        self, request: ems_pb2.BatchDeleteRequest, context: Context
    ) -> ems_pb2.BatchDeleteResponse:
        deleted = await self.state.delete_all(list(request.keys))
        return ems_pb2.BatchDeleteResponse(deleted=sum(deleted))

    @rpc
    async def BatchExists(
        self, request: ems_pb2.BatchExistsRequest, context: Context
    ) -> ems_pb2.BatchExistsResponse:
        return ems_pb2.BatchExistsResponse(exists=[self._exists(k).exists for k in request.keys])

    @rpc
    async def PrefixKeys(
        self, request: ems_pb2.PrefixRequest, context: Context
    ) -> ems_pb2.PrefixKeysResponse:
        keys = self.state.keys_for(list(request.tokens), request.block_tokens, request.namespace)
        return ems_pb2.PrefixKeysResponse(keys=keys)

    @rpc
    async def MatchPrefix(
        self, request: ems_pb2.PrefixRequest, context: Context
    ) -> ems_pb2.MatchPrefixResponse:
        keys = self.state.match(list(request.tokens), request.block_tokens, request.namespace)
        return ems_pb2.MatchPrefixResponse(
            matched_blocks=len(keys), matched_tokens=len(keys) * request.block_tokens, keys=keys
        )

    @rpc
    async def Stat(self, request: ems_pb2.StatRequest, context: Context) -> ems_pb2.StatResponse:
        s = self.state.stats(request.pool)
        return ems_pb2.StatResponse(
            objects=s.objects,
            dram_bytes=s.dram_bytes,
            dram_capacity_bytes=s.dram_capacity_bytes,
            dram_used_bytes=s.dram_used_bytes,
            ssd_objects=s.ssd_objects,
            ssd_used_bytes=s.ssd_used_bytes,
            ssd_capacity_bytes=s.ssd_capacity_bytes,
            replication_factor=s.replication_factor,
            under_replicated=s.under_replicated,
            hits=s.counters.hits,
            misses=s.counters.misses,
            evictions=s.counters.evictions,
            corrupt_copies=s.counters.corrupt,
            pools=[
                ems_pb2.PoolStat(
                    pool=p.pool,
                    healthy=p.healthy,
                    objects=p.objects,
                    bytes=p.bytes,
                    capacity_bytes=p.capacity_bytes,
                )
                for p in s.pools
            ],
            recovering=self.state.recovering,
            pools_listed=len(self.state.listed),
            pools_total=len(self.state.pools),
        )

    @rpc
    async def List(self, request: ems_pb2.ListRequest, context: Context) -> ems_pb2.ListResponse:
        page = self.state.listing(request.prefix, request.page_size, request.page_token)
        return ems_pb2.ListResponse(
            objects=[
                ems_pb2.ObjectInfo(
                    key=m.key,
                    size=m.size,
                    kind=_kind(m),
                    pinned=m.pinned,
                    tier=TIERS[m.tier],
                    replicas=list(m.replicas),
                )
                for m in page.objects
            ],
            next_page_token=page.next_token,
        )


def create_ems(
    *,
    address: str,
    topology: Topology,
    profile: HardwareProfile,
    clock: Timeline,
    peers: Peers,
    ssd_dir: Path,
    events: EventSink | None = None,
) -> tuple[EmsState, ServiceHost]:
    state = EmsState(
        topology=topology,
        profile=profile,
        clock=clock,
        peers=peers,
        ssd_dir=ssd_dir,
        events=events,
    )
    peers.host_ems(state)  # the serving and training engines of this process call it directly
    servicer = EmsServicer(state)
    host = ServiceHost(
        name="ems",
        address=address,
        services=[(SERVICE, lambda s: ems_pb2_grpc.add_EmsServicer_to_server(servicer, s))],
    )
    return state, host
