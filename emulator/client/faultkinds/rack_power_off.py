"""rack-power-off: a correlated failure. A rack's power distribution fails and every device of
every node in it (nodes_per_rack nodes: 4 on CloudMatrix384) crashes at once, each a `crash`
fault, as node-power-off does for one node. Its id `rack:<rack>` clears them all; the manager
sees each NPU's crash on its own and raises an incident for it. A rack that is the whole
supernode (cm-mini's one rack) takes a duration: no device would be left to clear it through,
so its processes clear it themselves in emulated time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import grpc

from emulator.client.clients import Clients
from emulator.client.faultkinds.base import (
    ActiveFault,
    DeviceKind,
    Typed,
    clear_device,
    not_found,
    spanning,
)
from emulator.model.errors import PreconditionError
from emulator.model.faults.catalogue import CrashParams
from emulator.model.racks import rack_devices

RACK_PREFIX = "rack:"
# each device's crash through its own management path first (it answers, then stops): told
# through a sibling, a call would be cut off when that sibling, in the rack too, goes down
CRASH = DeviceKind(name="crash", help="", params=CrashParams)


@dataclass(frozen=True, kw_only=True)
class RackPowerOff(Typed):
    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        devices = rack_devices(clients.topology, target)
        if len(devices) == len(clients.topology.devices) and not duration_s:
            raise PreconditionError(
                f"{target} holds every node of {clients.topology.supernode} "
                f"({clients.topology.preset}): with every device down none is left to clear "
                "the fault through; give it a duration (`--for`, a step's `duration`)",
                field="target",
                subject=target,
                reason="RACK_IS_THE_SUPERNODE",
            )
        crashed = await asyncio.gather(*(CRASH.add(clients, d, typed, duration_s) for d in devices))
        nodes = len({clients.topology.device(d).node for d in devices})
        return spanning(crashed, id=f"{RACK_PREFIX}{target}", kind=self.name, target=target,
                        detail=f"{len(devices)} devices of {nodes} nodes crashed")  # fmt: skip


def is_mine(fault_id: str) -> bool:
    return fault_id.startswith(RACK_PREFIX)


async def clear(clients: Clients, fault_id: str) -> None:
    """Every device's crash of the rack; NotFoundError when none was down."""
    devices = rack_devices(clients.topology, fault_id.removeprefix(RACK_PREFIX))
    results = await asyncio.gather(
        *(clear_device(clients, d, "crash") for d in devices), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if not (
            isinstance(error, grpc.aio.AioRpcError) and error.code() is grpc.StatusCode.NOT_FOUND
        ):
            raise error
    if len(errors) == len(devices):
        raise not_found(fault_id)


KIND = RackPowerOff(
    name="rack-power-off",
    help="a rack loses power: every device of every node in it crashes at once",
    params=CrashParams,
    target="a rack id (e.g. rack00: nodes n00-n03 on cm384; sn1-rack00 in supernode 1)",
)
