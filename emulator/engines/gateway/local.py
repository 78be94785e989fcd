"""A gateway engine of this process as a `GatewayPeer` (emulator/engines/peers.py): the other
gateways' engines, and a KV transfer of a serving deployment hosted beside it, call it as they
would call it over gRPC (emulator/client/gateway.py), with the same refusals and errors."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from cmemu.emulator.engines.gateway.types import (
    Landing,
    LinkStats,
    OpRequest,
    OpResult,
    Qp,
    RdmaOp,
    RouteInfo,
    TimedFlow,
)
from cmemu.emulator.engines.peers import within
from cmemu.emulator.model.errors import EmulatorError, relayed

if TYPE_CHECKING:
    from cmemu.emulator.engines.gateway.engine import GatewayEngine
    from cmemu.emulator.model.rdmafault import RdmaFault

T = TypeVar("T")


class LocalGateway:
    """A gateway engine of this process, called as a remote gateway would be: what a down
    gateway refuses it refuses (the engine's own check), under the caller's deadline, and its
    errors come back prefixed with the gateway's id, as a relayed status does."""

    def __init__(self, engine: GatewayEngine) -> None:
        self.engine = engine

    async def _call(self, call: Awaitable[T], deadline_s: float | None) -> T:
        try:
            return await within(deadline_s, call)
        except EmulatorError as exc:
            raise relayed(exc, self.engine.name) from exc

    async def create_qp(self, npu: str, die: int, *, deadline_s: float | None) -> Qp:
        return await self._call(self.engine.create_qp(npu, die), deadline_s)

    async def connect_qp(
        self, qpn: int, remote_gateway: str, remote_qpn: int, *, deadline_s: float | None
    ) -> Qp:
        return await self._call(self.engine.connect_qp(qpn, remote_gateway, remote_qpn), deadline_s)

    async def accept_qp(
        self,
        qpn: int,
        *,
        peer_gateway: str,
        peer_qpn: int,
        peer_npu: str,
        peer_die: int,
        deadline_s: float | None,
    ) -> Qp:
        call = self.engine.accept_qp(
            qpn, peer_gateway=peer_gateway, peer_qpn=peer_qpn, peer_npu=peer_npu, peer_die=peer_die
        )
        return await self._call(call, deadline_s)

    async def op(self, op: RdmaOp, request: OpRequest, *, deadline_s: float | None) -> OpResult:
        return await self._call(self.engine.op(op, request), deadline_s)

    async def land(self, landing: Landing, *, deadline_s: float | None) -> bytes:
        return await self._call(self.engine.land(landing), deadline_s)

    async def time_flow(
        self, src: str, dst: str, size: int, issue_ns: int, *, deadline_s: float | None
    ) -> TimedFlow:
        return await self._call(self.engine.time_flow(src, dst, size, issue_ns), deadline_s)

    async def link_stats(self, top: int, *, deadline_s: float | None) -> LinkStats:
        return await self._call(self.engine.link_stats(top), deadline_s)

    async def route(self, src: str, dst: str, *, deadline_s: float | None) -> RouteInfo:
        return await self._call(self.engine.route(src, dst), deadline_s)

    async def inject_fault(
        self, fault: RdmaFault[Any], *, deadline_s: float | None
    ) -> RdmaFault[Any]:
        return await self._call(self.engine.inject_fault(fault), deadline_s)

    async def clear_fault(
        self, fault_id: str, *, all: bool, deadline_s: float | None
    ) -> list[RdmaFault[Any]]:
        return await self._call(self.engine.clear_fault(fault_id, all=all), deadline_s)

    async def list_faults(self, *, deadline_s: float | None) -> list[RdmaFault[Any]]:
        return await self._call(self.engine.list_faults(), deadline_s)
