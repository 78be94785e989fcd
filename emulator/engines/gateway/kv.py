"""KV-cache transfers over the RDMA plane: what a serving deployment uses for prefill -> decode
when its topology has the plane (the real system moves KV caches over RDMA, keeping UB for the
MoE collectives). One queue pair per (prefill NPU, decode NPU), created on first use on the
supernode's gateway and kept; a pair an error left unusable is dropped and made anew next time.
"""

from __future__ import annotations

from typing import Protocol

from cmemu.emulator.engines.gateway.types import OpRequest, RdmaOp
from cmemu.emulator.engines.peers import GatewayPeer
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.topology import Device, Service, Topology


class Gateways(Protocol):
    """Where a deployment finds its supernode's gateway (services/peers.py `Peers`)."""

    @property
    def topology(self) -> Topology: ...

    def gateway(self, gateway: Service) -> GatewayPeer: ...


class KvOverRdma:
    """Size-only RDMA WRITEs from one NPU to another, through this supernode's gateway (no
    deadline: a transfer waits for its gateway as a controller does)."""

    def __init__(self, gateways: Gateways) -> None:
        plane = gateways.topology.scaleout
        assert plane is not None, "KvOverRdma needs a topology with the RDMA plane"
        service = plane.gateway(gateways.topology.index)
        self.gateway_id = service.id
        self._gateway = gateways.gateway(service)
        self._qps: dict[tuple[str, str], int] = {}

    @classmethod
    def of(cls, gateways: Gateways) -> KvOverRdma | None:
        """One for this topology, or None when it has no RDMA plane (UB carries the KV then)."""
        return cls(gateways) if gateways.topology.scaleout is not None else None

    async def _qp(self, src: Device, dst: Device) -> int:
        key = (src.id, dst.id)
        qpn = self._qps.get(key)
        if qpn is None:
            gw = self._gateway
            local = await gw.create_qp(src.id, 0, deadline_s=None)
            remote = await gw.create_qp(dst.id, 0, deadline_s=None)
            await gw.connect_qp(local.qpn, self.gateway_id, remote.qpn, deadline_s=None)
            qpn = self._qps[key] = local.qpn
        return qpn

    async def write(self, src: Device, dst: Device, offset: int, size: int) -> float:
        """Emulated seconds the transfer took, issue to completion."""
        try:
            qpn = await self._qp(src, dst)
            request = OpRequest(qpn=qpn, remote_offset=offset, size=size, size_only=True)
            done = await self._gateway.op(RdmaOp.WRITE, request, deadline_s=None)
        except EmulatorError:
            self._qps.pop((src.id, dst.id), None)  # an ERROR pair is not reused
            raise
        return (done.complete_ns - done.issue_ns) / 1e9
