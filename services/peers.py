"""Channels from one process to the devices of its topology, created once and shared.

A device issuing a UB transaction needs a stub for the target; in one process hundreds of devices
share this cache, so each target address has exactly one channel whatever the number of issuers.
"""

from __future__ import annotations

import grpc

from cmemu.v1 import fabric_pb2_grpc, ub_pb2_grpc
from emulator.topology import Device, ServiceKind, Topology

CLIENT_OPTIONS = (
    ("grpc.max_receive_message_length", 8 * 2**20),
    ("grpc.max_send_message_length", 8 * 2**20),
)


class Peers:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS)
            self._channels[address] = channel
        return channel

    def bus(self, device: Device) -> ub_pb2_grpc.UnifiedBusAsyncStub:
        return ub_pb2_grpc.UnifiedBusStub(self.channel(device.address))

    def fabric(self) -> fabric_pb2_grpc.FabricAsyncStub:
        return fabric_pb2_grpc.FabricStub(
            self.channel(self.topology.service(ServiceKind.FABRIC).address)
        )

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)
