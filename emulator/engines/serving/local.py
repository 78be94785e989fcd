"""The router's serving engine of this process, as the cluster manager follows a deployment's
restore (the RouterPeer protocol, emulator/engines/peers.py; its other implementation is the
typed gRPC client, emulator/client/control.py RemoteRouter): called directly, through the
router's outage (engines/outage.py; runtime/servicecontrol.py sets it), so a router killed, hung,
slowed or cut off in one process looks to the manager as it does across processes. A refusal is
the engine's EmulatorError prefixed "router: ", as the remote peer reads a relayed status.
"""

from __future__ import annotations

from cmemu.emulator.engines.serving.engine import ServingEngine
from cmemu.emulator.model.errors import EmulatorError, relayed

RELAYED_BY = "router"


class LocalRouter:
    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self.outage = engine.outage

    async def last_restored_ns(self, deployment: str) -> int:
        try:
            await self.outage.admit(None)  # no deadline: as the remote peer sets none
            health = self.engine.get(deployment).health()
        except EmulatorError as exc:
            raise relayed(exc, RELAYED_BY) from exc
        return 0 if health is None else health.last_restored_ns
