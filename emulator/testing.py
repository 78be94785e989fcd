"""Helpers for tests of the emulator and of software built on it (as structlog ships testing.py).

They start real servers on real ports; nothing here fakes a device.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from emulator.client import Clients
from emulator.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.inprocess import InProcessSupernode
from emulator.topology import PortPlan, build, server_count

__all__ = ["Clients", "free_port_block", "running_supernode"]

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
    broker: str | None = None,
) -> AsyncIterator[InProcessSupernode]:
    """A whole supernode on a free block of ports, verified SERVING, stopped on exit."""
    base = free_port_block(server_count(build(preset, profile=profile)))
    topology = build(preset, plan=PortPlan(base_port=base), time_scale=time_scale, profile=profile)
    async with InProcessSupernode(
        topology, profile=profile, drain_s=0.0, broker=broker
    ) as supernode:
        yield supernode
