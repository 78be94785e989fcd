"""service-down: a supernode-wide service (the cluster manager, the scheduler, EMS, the router,
the gateway, the fabric) hosted in the same process as the device the fault goes through is
stopped, hung, slowed or cut off, and brought back when the fault clears. It carries the
client's service-kill, service-hang, service-slow and service-partition in process
(emulator/client/faultkinds/service.py), which add it to one carrier device per service.

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

from cmemu.emulator.engines.device.faultbase import ActiveFault, Kind
from cmemu.emulator.model.errors import PreconditionError, quote
from cmemu.emulator.model.faults.params import AT_LEAST_ZERO, invalid, param
from cmemu.emulator.model.naming import SERVICES

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

NAME = "service-down"


@dataclass(frozen=True, kw_only=True)
class ServiceDownParams:
    """service-kill and service-hang as the device that hosts them in its process applies them
    (the client kinds take the service as their target, no params)."""

    service: str = param(help="the service: fabric, ems, scheduler, router, manager, gateway")
    hang: bool = param(False, "accept calls and answer none, instead of stopping the server")
    latency_ms: float = param(
        0.0, "instead: answer every call this many emulated ms late (service-slow)", AT_LEAST_ZERO
    )
    partition: bool = param(
        False,
        "instead: cut it off the network (service-partition): nothing reaches it and it reaches "
        "nothing, its work going on",
    )

    def check(self) -> None:
        if self.service not in SERVICES:
            raise invalid(NAME, "service", f"{self.service!r} is none of {', '.join(SERVICES)}")
        if self.hang and self.latency_ms:
            raise invalid(NAME, "latency_ms", "a hung service answers nothing: no latency")
        if self.partition and (self.hang or self.latency_ms):
            raise invalid(
                NAME, "partition", "is a way down of its own: not with hang or latency_ms"
            )


class ServiceControl(Protocol):
    """What a launcher lets its devices do to the services of their process."""

    def hosted(self) -> Collection[str]: ...  # the service kinds ("manager", ...) it can act on

    async def down(self, fault: ServiceDownParams) -> None: ...  # kill, hang or slow it

    async def up(self, fault: ServiceDownParams) -> None: ...  # and back

    async def ssd(self, *, lost: bool) -> None: ...  # EMS's SSD tier fails, or is replaced


def control_of(engine: DeviceEngine, service: str) -> ServiceControl:
    """The launcher's control of `service` in the device's process; FAILED_PRECONDITION when
    the process does not host it."""
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
    """service-down's effect: a service the device's process hosts stopped, hung or slowed."""

    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        params: ServiceDownParams = fault.params
        control = control_of(engine, params.service)
        for sibling in engine.faults.siblings.values():
            other = sibling.faults.active.get(NAME)
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


KIND = Kind(
    name=NAME,
    help="a service hosted in the device's process is stopped, hung, slowed or cut off (the "
    "carrier of service-kill, -hang, -slow and -partition in process)",
    params=ServiceDownParams,
    effect=ServiceDown(),
    one_device=False,
)
