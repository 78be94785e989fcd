"""EMS batch calls (BatchPut, BatchGet, BatchDelete, BatchExists) over 2..8 keys of the key space,
each checked against the ledger: the batch paths keep their own bookkeeping in the store."""

from __future__ import annotations

import random

import grpc

from bench.soak.config import CALL_TIMEOUT_S, KIB, log_uniform
from bench.soak.ems import EmsLoad
from bench.soak.ledger import Value, describe, holds, said, streamed
from cmemu.v1 import ems_pb2

Possible = dict[str, list[Value] | None]  # the ledger of the batch's keys before the call


class EmsBatches:
    def __init__(self, ems: EmsLoad) -> None:
        self.ems = ems
        self.calls = ems.calls
        self.objects = ems.objects
        self.stub = ems.stub

    async def batch(self, rng: random.Random) -> None:
        keys = sorted(rng.sample(self.ems.keys, rng.randint(2, 8)))
        locks = [self.objects.lock(k) for k in keys]
        for lock in locks:  # in key order: no two batches wait on each other
            await lock.acquire()
        try:
            batch = rng.choice((self.put, self.get, self.delete, self.exists))
            await batch(rng, keys, {k: self.objects.possible(k) for k in keys})
        finally:
            for lock in locks:
                lock.release()

    async def put(self, rng: random.Random, keys: list[str], possible: Possible) -> None:
        items = {k: rng.randbytes(log_uniform(rng, 1, 256 * KIB)) for k in keys}
        device = rng.choice(self.ems.npus).id
        request = ems_pb2.BatchPutRequest(
            items=[ems_pb2.PutRequest(key=k, data=v, device=device) for k, v in items.items()]
        )
        put = await self.calls.call(
            "ems.batch_put",
            self.stub.BatchPut(request, timeout=CALL_TIMEOUT_S),
            detail=f"{len(keys)} keys",
        )
        if isinstance(put, grpc.StatusCode):
            for k, v in items.items():
                self.objects.maybe(k, v, f"batch put {len(v)} B failed {put.name}")
        else:
            for item in put.items:
                where = ",".join(item.replicas)
                self.objects.acknowledged(
                    item.key, items[item.key], f"batch put {item.size} B -> {where}"
                )
            if sorted(i.key for i in put.items) != sorted(items):
                self.calls.wrong(
                    f"BatchPut of {sorted(items)} answered {[i.key for i in put.items]}"
                )

    async def get(self, rng: random.Random, keys: list[str], possible: Possible) -> None:
        # BatchGet serves objects of one chunk at most
        small = [k for k in keys if (p := possible[k]) is not None and not streamed(p)]
        if not small:
            return
        request = ems_pb2.BatchGetRequest(
            items=[ems_pb2.GetRequest(key=k, device=rng.choice(self.ems.npus).id) for k in small]
        )
        got = await self.calls.call(
            "ems.batch_get",
            self.stub.BatchGet(request, timeout=CALL_TIMEOUT_S),
            detail=f"{len(small)} keys",
        )
        if isinstance(got, grpc.StatusCode):
            return
        found = {item.key: item.data for item in got.items}
        for k in small:
            value = found.get(k)
            if k not in found and k not in got.missing:
                self.ems.disagree(f"BatchGet: {k} neither served nor missing", k)
            elif not holds(possible[k] or [], value):
                self.ems.disagree(
                    f"BatchGet of {k}: {said(value, 'missing')}; ledger {describe(possible[k])}",
                    k,
                )

    async def delete(self, rng: random.Random, keys: list[str], possible: Possible) -> None:
        gone = await self.calls.call(
            "ems.batch_delete",
            self.stub.BatchDelete(ems_pb2.BatchDeleteRequest(keys=keys), timeout=CALL_TIMEOUT_S),
            detail=f"{len(keys)} keys",
        )
        for k in keys:
            if isinstance(gone, grpc.StatusCode):
                self.objects.maybe(k, None, f"batch delete failed {gone.name}")
            else:
                self.objects.acknowledged(k, None, f"batch delete of {len(keys)}")
        definite = [p for p in possible.values() if p is not None and len(p) == 1]
        if not isinstance(gone, grpc.StatusCode) and len(definite) == len(keys):
            expected = sum(p[0] is not None for p in definite)
            if gone.deleted != expected:
                self.ems.disagree(
                    f"BatchDelete of {keys}: deleted {gone.deleted}, not {expected}", *keys
                )

    async def exists(self, rng: random.Random, keys: list[str], possible: Possible) -> None:
        exists = await self.calls.call(
            "ems.batch_exists",
            self.stub.BatchExists(ems_pb2.BatchExistsRequest(keys=keys), timeout=CALL_TIMEOUT_S),
            detail=f"{len(keys)} keys",
        )
        if isinstance(exists, grpc.StatusCode):
            return
        for k, there in zip(keys, exists.exists, strict=True):
            p = possible[k]
            if p is not None and all((v is not None) != there for v in p):
                self.ems.disagree(f"BatchExists of {k}: {there}; ledger {describe(p)}", k)
