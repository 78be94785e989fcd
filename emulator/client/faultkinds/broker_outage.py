"""broker-outage: the MQTT broker is unreachable: every emulator process hosting devices drops
its broker connection and stays away until the fault clears, buffering its events (telemetry
shows broker_connected false and events_pending) and sending them when it is back. The fault
goes through the devices' management path (a device kind, `broker-outage`, applied to the
process's event publisher: emulator/engines/device/kinds/broker_outage.py, its effect and
help), so it works in every launcher; services in processes that host no
device (procs mode) keep publishing. Its id is `broker`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import CALL_TIMEOUT_S, ActiveFault, Typed, via
from cmemu.emulator.client.status import reply_of
from cmemu.emulator.client.wire.device import fault_request
from cmemu.emulator.engines.device.kinds.broker_outage import KIND as DEVICE_KIND
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.model.faults.ids import FaultId
from cmemu.v1 import device_pb2


async def _hosts(clients: Clients) -> list[str]:
    """One device per live process (the first device of each process's listing), each once.
    A device of a dead process is answered for by a live one (`via` falls back to a proxy),
    whose listing may be one already picked: picking it again injected twice into one
    process, the second FAULT_ALREADY_ACTIVE (issue 21, finding 8)."""
    uncovered = [d.id for d in clients.topology.devices]
    picked: list[str] = []
    while uncovered:
        device = uncovered[0]
        listing = await via(
            clients,
            device,
            lambda stub: stub.ListFaults(
                device_pb2.ListDeviceFaultsRequest(process=True), timeout=CALL_TIMEOUT_S
            ),
        )
        hosted = set(listing.hosted) | {device}
        host = listing.hosted[0] if listing.hosted else device
        if host not in picked:
            picked.append(host)
        uncovered = [d for d in uncovered if d not in hosted]
    return picked


@dataclass(frozen=True, kw_only=True)
class BrokerOutage(Typed):
    target: str = "none"

    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        typed = self.typed(params)
        hosts = await _hosts(clients)
        stored = await asyncio.gather(
            *(
                reply_of(
                    None,
                    clients.device(h).InjectFault(
                        fault_request(self.name, typed, for_s=duration_s),
                        timeout=CALL_TIMEOUT_S,
                    ),
                )
                for h in hosts
            )
        )
        return ActiveFault(
            id=str(FaultId.broker()),
            kind=self.name,
            target="broker",
            detail=f"{len(hosts)} processes cut off",
            since_ns=stored[0].since_ns,
            until_ns=stored[0].until_ns,
        )


async def clear(clients: Clients) -> None:
    cleared = 0
    for host in await _hosts(clients):
        try:
            await reply_of(
                None,
                clients.device(host).ClearFault(
                    device_pb2.ClearDeviceFaultRequest(kind=DEVICE_KIND.name),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
            cleared += 1
        except NotFoundError:  # a process whose outage already ended
            pass
    if not cleared:
        raise NotFoundError(
            "no broker outage is active",
            subject=str(FaultId.broker()),
            reason="FAULT_NOT_FOUND",
        )


KIND = BrokerOutage(name=DEVICE_KIND.name, help=DEVICE_KIND.help, params=DEVICE_KIND.params)
