"""node-power-off: every device of a node crashes at once (each a `crash` fault); its id
`node:<node>` clears them all."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import ActiveFault, DeviceKind, Typed, spanning
from cmemu.emulator.engines.device.kinds import crash
from cmemu.emulator.model.errors import NotFoundError, quote
from cmemu.emulator.model.faults.ids import FaultId

CRASH = DeviceKind.of(crash.KIND)


def node_devices(clients: Clients, node: str) -> list[str]:
    devices = [d.id for d in clients.topology.devices if d.node == node]
    if not devices:
        raise NotFoundError(
            f"no node {quote(node)} (nodes: {', '.join(clients.topology.nodes[:4])}...)",
            field="target",
            subject=node,
            reason="NODE_NOT_FOUND",
        )
    return devices


@dataclass(frozen=True, kw_only=True)
class NodePowerOff(Typed):
    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        devices = node_devices(clients, target)
        crashed = await asyncio.gather(*(CRASH.add(clients, d, typed, duration_s) for d in devices))
        return spanning(crashed, id=str(FaultId.node(target)), kind=self.name, target=target,
                        detail=f"{len(devices)} devices crashed")  # fmt: skip


KIND = NodePowerOff(
    name="node-power-off",
    help="every device of a node crashes at once",
    params=crash.CrashParams,
    target="a node id (e.g. n03)",
)
