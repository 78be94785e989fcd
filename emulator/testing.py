"""Helpers for tests of the emulator and of software built on it (as structlog ships testing.py).

They start real servers on real ports; nothing here fakes a device.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from cmemu.v1 import (
    cpu_pb2_grpc,
    device_pb2_grpc,
    fabric_pb2_grpc,
    mempool_pb2_grpc,
    npu_pb2_grpc,
    ub_pb2_grpc,
)
from emulator import health
from emulator.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.inprocess import InProcessSupernode
from emulator.topology import PortPlan, Topology, build, server_count
from services.peers import Peers

# Below Linux's ephemeral range (32768+), so that client sockets do not take these ports.
SEARCH_FROM, SEARCH_TO = 22000, 32000


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(count: int, host: str = "127.0.0.1", *, start: int = SEARCH_FROM) -> int:
    """The first port of `count` consecutive ports that are free on `host` right now."""
    base = start
    while base + count <= SEARCH_TO:
        taken = next((p for p in range(base, base + count) if not _free(host, p)), None)
        if taken is None:
            return base
        base = taken + 1
    raise RuntimeError(f"no block of {count} free ports between {start} and {SEARCH_TO}")


@asynccontextmanager
async def running_supernode(
    preset: str = "cm-mini",
    *,
    time_scale: float = 1.0,
    profile: HardwareProfile = DEFAULT_PROFILE,
) -> AsyncIterator[InProcessSupernode]:
    """A whole supernode on a free block of ports, verified SERVING, stopped on exit."""
    base = free_port_block(server_count(build(preset, profile=profile)))
    topology = build(preset, plan=PortPlan(base_port=base), time_scale=time_scale, profile=profile)
    async with InProcessSupernode(topology, profile=profile, drain_s=0.0) as supernode:
        yield supernode


class Clients:
    """Typed async stubs for any device of a topology, over one shared channel per device."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._peers = Peers(topology)

    def _channel(self, device_id: str) -> grpc.aio.Channel:
        return self._peers.channel(self.topology.device(device_id).address)

    def device(self, device_id: str) -> device_pb2_grpc.DeviceAsyncStub:
        return device_pb2_grpc.DeviceStub(self._channel(device_id))

    def bus(self, device_id: str) -> ub_pb2_grpc.UnifiedBusAsyncStub:
        return ub_pb2_grpc.UnifiedBusStub(self._channel(device_id))

    def npu(self, device_id: str) -> npu_pb2_grpc.NpuAsyncStub:
        return npu_pb2_grpc.NpuStub(self._channel(device_id))

    def cpu(self, device_id: str) -> cpu_pb2_grpc.CpuAsyncStub:
        return cpu_pb2_grpc.CpuStub(self._channel(device_id))

    def fabric(self) -> fabric_pb2_grpc.FabricAsyncStub:
        return self._peers.fabric()

    def mempool(self, device_id: str) -> mempool_pb2_grpc.MemoryPoolAsyncStub:
        return mempool_pb2_grpc.MemoryPoolStub(self._channel(device_id))

    async def health(self, device_id: str, service: str = "") -> str:
        return await health.check(self._channel(device_id), service)

    async def close(self) -> None:
        await self._peers.close()
