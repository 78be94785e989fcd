"""ssd-loss: the drives of EMS's SSD tier fail. What only the SSD held (objects EMS had
demoted there from its DRAM pools) is gone: a get finds no such key (NOT_FOUND), the objects
still in the pools are untouched, and until the fault clears (new, empty drives) an eviction
drops the object instead of demoting it. EMS counts the objects (`cmemu_ems_ssd_lost_total`)
and publishes `ssd-lost` (objects, bytes) and, cleared, `ssd-replaced`.

The target is the EMS service (`ems`, `sn1-ems`). In process only, like service-slow: it travels
through the management path of a device of EMS's process (the device kind `ssd-loss`,
emulator/engines/device/kinds/ssd_loss.py: its effect and help); other launchers are refused,
naming the mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faultkinds.base import (
    CALL_TIMEOUT_S,
    ActiveFault,
    Typed,
    device_fault,
    via,
)
from cmemu.emulator.client.faultkinds.service import CARRIER, mode_of, service_of
from cmemu.emulator.client.wire.device import fault_request
from cmemu.emulator.engines.device.kinds.ssd_loss import KIND as DEVICE_KIND
from cmemu.emulator.model.errors import InvalidArgumentError, PreconditionError, quote
from cmemu.emulator.model.topology import ServiceKind
from cmemu.v1 import device_pb2

NAME = DEVICE_KIND.name


def _ems(clients: Clients, target: str) -> str:
    service = service_of(clients, target or ServiceKind.EMS.value)
    if service.kind is not ServiceKind.EMS:
        raise InvalidArgumentError(
            f"{NAME} fails EMS's SSD tier: its target is the ems service, not {quote(target)}",
            field="target",
            subject=target,
            reason="NOT_EMS",
        )
    return service.id


@dataclass(frozen=True, kw_only=True)
class SsdLoss(Typed):
    async def add(
        self, clients: Clients, target: str, params: Any, duration_s: float | None
    ) -> ActiveFault:
        self.typed(params)
        ems = _ems(clients, target)
        mode = mode_of(clients)
        if mode != "inprocess":
            raise PreconditionError(
                f"{NAME} works in process only (a {mode} launch)",
                field="kind",
                subject=NAME,
                reason="LAUNCHER_UNSUPPORTED",
            )
        devices = clients.topology.devices
        carrier = devices[CARRIER[ServiceKind.EMS] % len(devices)].id
        request = fault_request(NAME, self.typed(params), for_s=duration_s, device=carrier)
        stored = await via(
            clients, carrier, lambda stub: stub.InjectFault(request, timeout=CALL_TIMEOUT_S)
        )
        return listed(stored, ems)


def listed(state: device_pb2.FaultState, ems: str) -> ActiveFault:
    """As `cmemu fault ls` shows it: the EMS's fault (its id the carrier's, which rm takes)."""
    fault = device_fault(state)
    return ActiveFault(id=fault.id, kind=NAME, target=ems, detail=f"through {state.device}",
                       since_ns=fault.since_ns, until_ns=fault.until_ns)  # fmt: skip


def ems_of(clients: Clients, carrier: str) -> str:
    """The EMS of the carrier's supernode."""
    for topology in clients.supernodes:
        if any(d.id == carrier for d in topology.devices):
            return next((s.id for s in topology.services if s.kind is ServiceKind.EMS), carrier)
    return carrier


KIND = SsdLoss(name=NAME, help=DEVICE_KIND.help, params=DEVICE_KIND.params,
               target=DEVICE_KIND.target)  # fmt: skip
