"""The router's serving engine of this process, as its callers in this process reach it: the
cluster manager following a deployment's restore (`LocalRouter`, the RouterPeer protocol of
emulator/engines/peers.py) and the scheduler's day plans moving a deployment (`LocalDayServing`,
DayServing of emulator/engines/dayplan.py). Their other implementations are the typed gRPC
clients (emulator/client/control.py RemoteRouter, emulator/client/dayplan.py RemoteDayServing).

Each call goes through the router's outage (engines/outage.py; runtime/servicecontrol.py sets
it), so a router killed, hung, slowed or cut off in one process looks to its callers as it does
across processes. A refusal is the engine's EmulatorError prefixed "router: ", as the remote
peer reads a relayed status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from cmemu.emulator.engines.serving.engine import ServingEngine
from cmemu.emulator.engines.serving.spec import DeployAsk
from cmemu.emulator.model.errors import EmulatorError, relayed

RELAYED_BY = "router"
T = TypeVar("T")


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


class LocalDayServing:
    """What cmemu.v1.Router's GetDeployment, Deploy (waited for, warm), Undeploy, GetStats and
    GetUsage answer a day plan over gRPC, asked of the engine."""

    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self.outage = engine.outage

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call` once the router admits it (no deadline: as the remote peer sets none)."""
        try:
            await self.outage.admit(None)
            return await call()
        except EmulatorError as exc:
            raise relayed(exc, RELAYED_BY) from exc

    async def spec(self, deployment: str) -> tuple[str, int]:
        async def spec() -> tuple[str, int]:
            live = self.engine.get(deployment)
            return live.spec_yaml, live.npus

        return await self._call(spec)

    async def deploy(self, deployment: str, spec_yaml: str) -> int:
        ask = DeployAsk(name=deployment, spec_yaml=spec_yaml, wait=True, warm=True)

        async def deploy() -> int:
            return (await self.engine.deploy(ask)).npus

        return await self._call(deploy)

    async def undeploy(self, deployment: str) -> None:
        async def undeploy() -> None:
            await self.engine.undeploy(deployment)

        await self._call(undeploy)

    async def in_flight(self, deployment: str) -> int:
        async def in_flight() -> int:
            return self.engine.stats(deployment).requests_in_flight

        return await self._call(in_flight)

    async def served_tokens(self) -> int:
        async def served() -> int:
            return self.engine.usage.completion_tokens()

        return await self._call(served)
