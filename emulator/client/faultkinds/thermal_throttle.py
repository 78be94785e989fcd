"""thermal-throttle as a user adds it: to a node, every NPU of which applies the device kind
(emulator/engines/device/kinds/thermal_throttle.py: its params, help and effect) at once, all or
nothing. One fault id, `node:<node>:thermal-throttle`, clears every NPU's."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import (
    ActiveFault,
    DeviceKind,
    Typed,
    clear_device,
    not_found,
    spanning,
)
from cmemu.emulator.client.faultkinds.node_power_off import node_devices
from cmemu.emulator.engines.device.kinds import thermal_throttle as device_kind
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.emulator.model.naming import node_id, parse_device
from cmemu.emulator.model.topology import DeviceKind as Hardware

NAME = device_kind.KIND.name
PER_NPU = DeviceKind.of(device_kind.KIND)


def node_npus(clients: Clients, node: str) -> list[str]:
    topology = clients.topology
    return [d for d in node_devices(clients, node) if topology.device(d).kind is Hardware.NPU]


@dataclass(frozen=True, kw_only=True)
class ThermalThrottle(Typed):
    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        npus = node_npus(clients, target)
        results = await asyncio.gather(
            *(PER_NPU.add(clients, d, typed, duration_s) for d in npus), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # all or nothing: undo the NPUs that took it
            for device, result in zip(npus, results, strict=True):
                if not isinstance(result, BaseException):
                    with contextlib.suppress(Exception):
                        await clear_device(clients, device, NAME)
            raise failed[0]
        done = [r for r in results if isinstance(r, ActiveFault)]
        return spanning(done, id=str(FaultId.node(target, NAME)), kind=self.name, target=target,
                        detail=f"compute={typed.compute:g} on {len(npus)} NPUs")  # fmt: skip


def grouped(listed: list[ActiveFault]) -> list[ActiveFault]:
    """A listing with each node's NPU throttles as the one fault they were added as."""
    out: list[ActiveFault] = []
    nodes: dict[str, list[ActiveFault]] = {}
    for fault in listed:
        if fault.kind == NAME:
            name = parse_device(fault.target)
            node = node_id(name.node, supernode=name.supernode)
            nodes.setdefault(node, []).append(fault)
        else:
            out.append(fault)
    for node, npus in nodes.items():
        out.append(spanning(npus, id=str(FaultId.node(node, NAME)), kind=NAME, target=node,
                            detail=f"{npus[0].detail} on {len(npus)} NPUs"))  # fmt: skip
    return out


async def clear(clients: Clients, fault_id: FaultId) -> None:
    """Every NPU's throttle of the node (`node:<node>:thermal-throttle`); NotFoundError when
    none had it."""
    npus = node_npus(clients, fault_id.subject)
    results = await asyncio.gather(
        *(clear_device(clients, d, NAME) for d in npus), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if not isinstance(error, NotFoundError):
            raise error
    if len(errors) == len(npus):
        raise not_found(fault_id)


KIND = ThermalThrottle(
    name=NAME,
    help=device_kind.KIND.help,
    params=device_kind.KIND.params,
    target="a node id (e.g. n03)",
)
