"""KV-cache transfers over the RDMA plane: what a serving deployment uses for prefill -> decode
when its topology has the plane (the real system moves KV caches over RDMA, keeping UB for the
MoE collectives). One queue pair per (prefill NPU, decode NPU), created on first use on the
supernode's gateway and kept; a pair an error left unusable is dropped and made anew next time.
"""

from __future__ import annotations

import grpc

from cmemu.v1 import gateway_pb2, gateway_pb2_grpc
from emulator.model.topology import Device
from services.peers import Peers
from services.rpc import RemoteError


class KvOverRdma:
    """Size-only RDMA WRITEs from one NPU to another, through this supernode's gateway."""

    def __init__(self, peers: Peers) -> None:
        plane = peers.topology.scaleout
        assert plane is not None, "KvOverRdma needs a topology with the RDMA plane"
        self.gateway_id = plane.gateway(peers.topology.index).id
        self._stub = gateway_pb2_grpc.GatewayStub(
            peers.channel(plane.gateway(peers.topology.index).address)
        )
        self._qps: dict[tuple[str, str], int] = {}

    @classmethod
    def of(cls, peers: Peers) -> KvOverRdma | None:
        """One for this topology, or None when it has no RDMA plane (UB carries the KV then)."""
        return cls(peers) if peers.topology.scaleout is not None else None

    async def _qp(self, src: Device, dst: Device) -> int:
        key = (src.id, dst.id)
        qpn = self._qps.get(key)
        if qpn is None:
            local = await self._stub.CreateQp(gateway_pb2.CreateQpRequest(npu=src.id))
            remote = await self._stub.CreateQp(gateway_pb2.CreateQpRequest(npu=dst.id))
            await self._stub.ConnectQp(
                gateway_pb2.ConnectQpRequest(
                    qpn=local.qpn, remote_gateway=self.gateway_id, remote_qpn=remote.qpn
                )
            )
            qpn = self._qps[key] = local.qpn
        return qpn

    async def write(self, src: Device, dst: Device, offset: int, size: int) -> float:
        """Emulated seconds the transfer took, issue to completion."""
        try:
            qpn = await self._qp(src, dst)
            done: gateway_pb2.RdmaCompletion = await self._stub.Write(
                gateway_pb2.RdmaRequest(qpn=qpn, remote_offset=offset, size=size, size_only=True)
            )
        except grpc.aio.AioRpcError as exc:
            self._qps.pop((src.id, dst.id), None)  # an ERROR pair is not reused
            raise RemoteError.from_rpc_error(exc, self.gateway_id) from exc
        return (done.complete_ns - done.issue_ns) / 1e9
