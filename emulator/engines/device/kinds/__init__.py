"""The device fault kinds: one module each, holding the kind's whole story (its typed params and
their checks, its help, the device kinds it applies to, its effect on the device), and this one
table of them. The device's fault operations (faults.py), the wire's params table
(services/device.py) and the client's device kinds (emulator/client/faults.py) are all made from
KINDS; what the kinds share lives in faultbase.py."""

from __future__ import annotations

from typing import Any

from cmemu.emulator.engines.device.faultbase import Kind
from cmemu.emulator.engines.device.kinds import (
    broker_outage,
    clock_skew,
    crash,
    device_down,
    die_down,
    hang,
    hbm_ecc,
    intermittent_hang,
    pool_loss,
    sdc,
    service_down,
    slow,
    ssd_loss,
    thermal_throttle,
)
from cmemu.emulator.model.faults.params import unknown_kind

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        device_down.KIND,
        broker_outage.KIND,
        crash.KIND,
        hang.KIND,
        slow.KIND,
        thermal_throttle.KIND,
        intermittent_hang.KIND,
        hbm_ecc.KIND,
        sdc.KIND,
        die_down.KIND,
        pool_loss.KIND,
        service_down.KIND,
        ssd_loss.KIND,
        clock_skew.KIND,
    )
}
"""Every kind a device applies itself, by name."""

PARAMS: dict[str, type[Any]] = {name: k.params for name, k in KINDS.items()}
"""Their params classes by kind: FaultState's `oneof params` (emulator/client/wire/faultparams.py
unpacks by it, and checks that it and the proto agree)."""


def kind_of(name: str) -> Kind:
    """A device kind by name; INVALID_ARGUMENT UNKNOWN_FAULT_KIND listing the known ones."""
    kind = KINDS.get(name)
    if kind is None:
        raise unknown_kind(name, KINDS, plane="device")
    return kind
