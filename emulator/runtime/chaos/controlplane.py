"""The control plane as a scenario's target (service-kill, service-hang): what the runner does
about a service it took down. A service still down at the end is brought back before the
workloads' records are read (a training job's are on the manager's server), and waited for:
a client that failed to connect is in gRPC's reconnect backoff for up to a wall second, which
is most of a minute of emulated time at a high time scale."""

from __future__ import annotations

import asyncio

from cmemu.emulator.client import health
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.status import code_name
from cmemu.emulator.model.chaos.observed import Injection
from cmemu.emulator.model.chaos.recovery import CONTROL_PLANE_KINDS
from cmemu.emulator.model.errors import EmulatorError

BACK_WALL_S = 10.0  # wall: how long a service brought back may take to answer


def still_down(injections: list[Injection]) -> list[Injection]:
    """The control-plane faults that went in and were not cleared."""
    return [
        i
        for i in injections
        if i.fault_id and i.cleared_ns is None and i.kind in CONTROL_PLANE_KINDS
    ]


async def answering(clients: Clients, services: list[str]) -> list[str]:
    """Wait until each service (a kind or an id) answers its health check again; what did not,
    as notes (a process the procs launcher does not restart stays down)."""

    async def one(name: str) -> str:
        address = next(
            (s.address for s in clients.topology.services if name in (s.id, s.kind.value)), None
        )
        if address is None:
            return ""
        channel = clients.channel_to(address)
        try:
            await health.check(channel, timeout_s=BACK_WALL_S, wait_for_ready=True)
        except EmulatorError as exc:
            return f"{name} did not answer once brought back: {code_name(exc)}"
        return ""

    notes = await asyncio.gather(*(one(s) for s in dict.fromkeys(services)))
    return [n for n in notes if n]
