"""service-kill, service-hang and service-slow as a process applies them (and ssd-loss, the
failure of the SSD tier of an EMS hosted there): a supernode-wide
service (the cluster manager, the scheduler, EMS, the router, the gateway) hosted in the same
process as the device the fault goes through is stopped, hung or slowed, and brought back when
the fault clears.

The device only carries the fault (its management path answers when the service does not, as a
BMC would); what is done to the service is the launcher's (`ServiceControl`, given to the
process's devices as `Siblings.services` by the in-process supernode), since the engines know
nothing of servers. A process that hosts no such service refuses with FAILED_PRECONDITION
SERVICE_NOT_IN_PROCESS: the procs launcher's services are processes of their own, killed and
paused by process-kill and process-pause instead.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cmemu.emulator.engines.device.faultbase import ALL, ActiveFault
from cmemu.emulator.model.errors import PreconditionError, quote
from cmemu.emulator.model.faults.catalogue import ServiceDownParams
from cmemu.emulator.model.topology import DeviceKind

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

KIND = "service-down"  # the device kind; the catalogue's service-kill and service-hang use it


class ServiceControl(Protocol):
    """What a launcher lets its devices do to the services of their process."""

    def hosted(self) -> Collection[str]: ...  # the service kinds ("manager", ...) it can act on

    async def down(self, fault: ServiceDownParams) -> None: ...  # kill, hang or slow it

    async def up(self, fault: ServiceDownParams) -> None: ...  # and back

    async def ssd(self, *, lost: bool) -> None: ...  # EMS's SSD tier fails, or is replaced


def _control(engine: DeviceEngine, service: str) -> ServiceControl:
    control = engine.faults.siblings.services
    hosted = sorted(control.hosted()) if control is not None else []
    if control is None or service not in hosted:
        raise PreconditionError(
            f"{engine.device.id}'s process does not host the {service} service (it hosts "
            f"{', '.join(hosted) or 'none'}): in procs mode use process-kill/process-pause of "
            "its process, in compose container-kill/container-pause",
            field="params.service",
            subject=service,
            reason="SERVICE_NOT_IN_PROCESS",
        )
    return control


@dataclass(frozen=True)
class ServiceDown:
    on: frozenset[DeviceKind] = ALL

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        params: ServiceDownParams = fault.params
        control = _control(engine, params.service)
        for sibling in engine.faults.siblings.values():
            other = sibling.faults.active.get(KIND)
            if other is not None and other is not fault and other.params.service == params.service:
                raise PreconditionError(
                    f"the {params.service} service is down already (through {sibling.device.id});"
                    " clear that fault first",
                    subject=params.service,
                    reason="FAULT_ALREADY_ACTIVE",
                )
        await control.down(params)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        params: ServiceDownParams = fault.params
        control = engine.faults.siblings.services
        if control is None:
            raise PreconditionError(f"no service control to bring {quote(params.service)} back")
        await control.up(params)


@dataclass(frozen=True)
class SsdLoss:
    """EMS's SSD tier fails (its objects that were only there are gone) until cleared: new
    drives, empty (emulator/engines/ems EmsState.lose_ssd)."""

    on: frozenset[DeviceKind] = ALL

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        await _control(engine, "ems").ssd(lost=True)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        control = engine.faults.siblings.services
        if control is not None:
            await control.ssd(lost=False)
