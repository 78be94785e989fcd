"""The EMS engine of this process, called as the remote store would be: the other
implementation of the KvStore and ObjectStore protocols (engines/serving/peers.py,
engines/peers.py) beside the typed gRPC client (emulator/client/ems.py). A serving deployment or
a training job of this process then stores and reads with no serialising and no gRPC call.

It checks what the servicer checks (services/ems.py: the key, the size, a device that exists, a
batch's keys once each) and goes through the store's outage (engines/outage.py), so a killed,
hung, slowed or cut-off EMS service looks the same here as across processes; a refusal is the
store's EmulatorError, unprefixed, as the typed client raises it from the status.
"""

from __future__ import annotations

from collections.abc import Sequence

from cmemu.emulator.engines.ems import EmsState, Stored
from cmemu.emulator.model.ems import ObjectMeta
from cmemu.emulator.model.ems.objects import Got, ObjectKind, PrefixMatch, Put
from cmemu.emulator.model.errors import InvalidArgumentError

KIND_NUMBER = {ObjectKind.KV: 1, ObjectKind.WEIGHTS: 2, ObjectKind.CHECKPOINT: 3}
"""Each kind as the store records it (cmemu.v1.ObjectKind's numbers: model/ems/keys.py KINDS)."""


class LocalEms:
    def __init__(self, store: EmsState) -> None:
        self.store = store
        self.outage = store.outage

    def _item(
        self, key: str, data: bytes, *, size: int, kind: ObjectKind, device: str
    ) -> tuple[ObjectMeta, bytes, str]:
        streamed = len(data) > self.store.ems.chunk_bytes  # the client's PutStream
        meta = self.store.new_object(
            key, len(data), size=size, kind=KIND_NUMBER[kind], device=device, streamed=streamed
        )
        return meta, data, device

    async def put(
        self,
        key: str,
        data: bytes = b"",
        *,
        size: int = 0,
        kind: ObjectKind = ObjectKind.KV,
        device: str = "",
    ) -> Put:
        if data and size not in (0, len(data)):
            raise InvalidArgumentError(
                f"size {size} differs from len(data) {len(data)}", field="size"
            )
        return await self.outage.through(self._put(key, data, size=size, kind=kind, device=device))

    async def _put(self, key: str, data: bytes, *, size: int, kind: ObjectKind, device: str) -> Put:
        meta, data, device = self._item(key, data, size=size, kind=kind, device=device)
        return _put(await self.store.put(meta, data, device))

    async def put_sizes(
        self, keys: Sequence[str], *, size: int, kind: ObjectKind, device: str = ""
    ) -> list[Put]:
        return await self.outage.through(self._put_sizes(keys, size=size, kind=kind, device=device))

    async def _put_sizes(
        self, keys: Sequence[str], *, size: int, kind: ObjectKind, device: str
    ) -> list[Put]:
        items = [self._item(k, b"", size=size, kind=kind, device=device) for k in keys]
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError("a key appears twice in one batch", field="items")
        return [_put(s) for s in await self.store.put_all(items)]

    async def load(self, key: str, *, device: str = "") -> Got:
        f = await self.outage.through(self.store.get(key, device, self.store.ems.chunk_bytes))
        return Got(
            key=f.meta.key,
            data=f.data,
            size=f.meta.size,
            served_by=f.served_by,
            issue_ns=f.issue_ns,
            complete_ns=f.complete_ns,
        )

    async def delete_many(self, keys: Sequence[str]) -> None:
        await self.outage.through(self.store.delete_all(list(keys)))

    async def exist(self, keys: Sequence[str]) -> list[bool]:
        return await self.outage.through(self._exist(keys))

    async def _exist(self, keys: Sequence[str]) -> list[bool]:
        return [self.store.lookup(k) is not None for k in keys]

    async def match_prefix(
        self, tokens: Sequence[int], *, block_tokens: int, namespace: str = ""
    ) -> PrefixMatch:
        return await self.outage.through(self._match(tokens, block_tokens, namespace))

    async def _match(self, tokens: Sequence[int], block_tokens: int, namespace: str) -> PrefixMatch:
        keys = self.store.match(list(tokens), block_tokens, namespace)
        return PrefixMatch(
            matched_blocks=len(keys), matched_tokens=len(keys) * block_tokens, keys=tuple(keys)
        )


def _put(stored: Stored) -> Put:
    return Put(
        key=stored.meta.key,
        size=stored.meta.size,
        replicas=tuple(stored.replicas),
        issue_ns=stored.timing.issue_ns,
        complete_ns=stored.timing.complete_ns,
        evicted=stored.evicted,
    )
