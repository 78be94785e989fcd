"""The EMS service: the elastic memory store over the nodes' memory pools.

Protobuf in, the store (services/ems_store.py, over the model in emulator/model/ems) in between,
protobuf out; domain errors become statuses through `rpc`.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import cast

from cmemu.v1 import ems_pb2, ems_pb2_grpc
from emulator.model.clock import Clock
from emulator.model.ems import ObjectMeta, Tier, check_key, object_size
from emulator.model.errors import NotFoundError
from emulator.model.hardware import HardwareProfile
from emulator.model.topology import Topology
from services.ems_store import EmsState, Fetched
from services.host import ServiceHost
from services.peers import Peers
from services.status import Context, rpc

__all__ = ["SERVICE", "EmsServicer", "EmsState", "create_ems"]

SERVICE = "cmemu.v1.Ems"
TIERS: dict[Tier, ems_pb2.Tier.ValueType] = {
    Tier.DRAM: ems_pb2.TIER_DRAM,
    Tier.SSD: ems_pb2.TIER_SSD,
}


def _kind(meta: ObjectMeta) -> ems_pb2.ObjectKind.ValueType:
    return cast(ems_pb2.ObjectKind.ValueType, meta.kind)


def _got(f: Fetched) -> ems_pb2.GetResponse:
    return ems_pb2.GetResponse(
        key=f.meta.key,
        data=f.data,
        size=f.meta.size,
        kind=_kind(f.meta),
        tier=TIERS[f.meta.tier],
        served_by=f.served_by,
        corrupt_copies=f.corrupt_copies,
        issue_ns=f.issue_ns,
        complete_ns=f.complete_ns,
    )


class EmsServicer(ems_pb2_grpc.EmsServicer):
    def __init__(self, state: EmsState) -> None:
        self.state = state

    async def _put(self, request: ems_pb2.PutRequest) -> ems_pb2.PutResponse:
        check_key(request.key)
        meta = ObjectMeta(
            key=request.key,
            kind=request.kind or ems_pb2.OBJECT_KIND_KV_BLOCK,
            size=object_size(len(request.data), request.size, self.state.ems),
            crc=zlib.crc32(request.data) if request.data else None,
            pinned=request.pinned,
        )
        stored = await self.state.put(meta, request.data, request.device)
        return ems_pb2.PutResponse(
            key=meta.key,
            size=meta.size,
            replicas=stored.replicas,
            issue_ns=stored.timing.issue_ns,
            complete_ns=stored.timing.complete_ns,
            evicted=stored.evicted,
        )

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
        return _got(await self.state.get(request.key, request.device))

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
        return ems_pb2.BatchPutResponse(items=[await self._put(item) for item in request.items])

    @rpc
    async def BatchGet(
        self, request: ems_pb2.BatchGetRequest, context: Context
    ) -> ems_pb2.BatchGetResponse:
        reply = ems_pb2.BatchGetResponse()
        for item in request.items:
            try:
                reply.items.append(_got(await self.state.get(item.key, item.device)))
            except NotFoundError:
                reply.missing.append(item.key)
        return reply

    @rpc
    async def BatchDelete(
        self, request: ems_pb2.BatchDeleteRequest, context: Context
    ) -> ems_pb2.BatchDeleteResponse:
        deleted = [await self.state.delete(key) for key in request.keys]
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
    clock: Clock,
    peers: Peers,
    ssd_dir: Path,
) -> tuple[EmsState, ServiceHost]:
    state = EmsState(topology=topology, profile=profile, clock=clock, peers=peers, ssd_dir=ssd_dir)
    servicer = EmsServicer(state)
    host = ServiceHost(
        name="ems",
        address=address,
        services=[(SERVICE, lambda s: ems_pb2_grpc.add_EmsServicer_to_server(servicer, s))],
    )
    return state, host
