"""What the serving engine needs of its peers beyond engines/peers.py's: EMS as a deployment
keeps its weights and KV blocks in it and looks prompts' prefixes up (`KvStore`, more than a
training job's `ObjectStore`), and its NPUs, the fabric and the RDMA plane's gateway in one
directory (`ServingDirectory`). The process's `Peers` (services/peers.py) satisfies the
directory; EMS's engine in this process (engines/ems/local.py) or the typed EMS client
(emulator/client/ems.py) the store, structurally; the scheduler is a `JobScheduler`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cmemu.emulator.engines.peers import Directory, GatewayPeer, ObjectStore
from cmemu.emulator.model.ems.objects import ObjectKind, PrefixMatch, Put
from cmemu.emulator.model.topology import Service, Topology


class KvStore(ObjectStore, Protocol):
    """EMS, as a serving deployment keeps its weights and KV blocks in it."""

    async def exist(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored, in the order asked."""
        ...

    async def put_sizes(
        self, keys: Sequence[str], *, size: int, kind: ObjectKind, device: str = ""
    ) -> list[Put]:
        """Size-only objects of `size` bytes each, in one call (a prompt's new KV blocks)."""
        ...

    async def match_prefix(
        self, tokens: Sequence[int], *, block_tokens: int, namespace: str = ""
    ) -> PrefixMatch:
        """How much of a prompt's prefix EMS holds the KV blocks of."""
        ...


class ServingDirectory(Directory, Protocol):
    """Every peer of the serving engine: its NPUs and the fabric (the steps' collectives and
    KV transfers), and the RDMA plane's gateway when the topology has one (KV over RDMA:
    engines/gateway/kv.py)."""

    @property
    def topology(self) -> Topology: ...

    def gateway(self, gateway: Service) -> GatewayPeer: ...
