"""broker-outage: the MQTT broker is unreachable from this device's process: its event publisher
lets go and buffers (emulator/runtime/events.py EventBus.hold) until the fault clears (telemetry
shows broker_connected false and events_pending). One publisher per process, so one outage per
process. The client's kind of this name cuts every process off at once, through one device of
each (emulator/client/faultkinds/broker_outage.py, fault id `broker`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cmemu.emulator.engines.device.faultbase import ActiveFault, Kind
from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.faults.params import NoParams

if TYPE_CHECKING:
    from cmemu.emulator.engines.device.engine import DeviceEngine

NAME = "broker-outage"


@dataclass(frozen=True)
class BrokerOutage:
    async def apply(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        hold = getattr(engine.events, "hold", None)
        if hold is None:
            raise PreconditionError(
                f"{engine.device.id}'s process publishes no events (no MQTT broker)",
                subject=engine.device.id,
                reason="NO_BROKER",
            )
        for sibling in engine.faults.siblings.values():  # one publisher per process
            if sibling is not engine and NAME in sibling.faults.active:
                raise PreconditionError(
                    f"this process's broker outage is on {sibling.device.id} already",
                    subject=sibling.device.id,
                    reason="FAULT_ALREADY_ACTIVE",
                )
        hold(True)

    async def undo(self, engine: DeviceEngine, fault: ActiveFault) -> None:
        hold = getattr(engine.events, "hold", None)
        if hold is not None:
            hold(False)


KIND = Kind(
    name=NAME,
    help="the MQTT broker is unreachable: devices buffer their events until it is back",
    params=NoParams,
    effect=BrokerOutage(),
    target="none",
    one_device=False,
)
