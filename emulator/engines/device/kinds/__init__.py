"""The device fault kinds: one module each, holding the kind's whole story (its typed params and
their checks, its help, the device kinds it applies to, its effect on the device), and this one
table of them. The device's fault operations (faults.py), the wire's params table
(services/device.py) and the client's device kinds (emulator/client/faults.py) are all made from
KINDS; what the kinds share lives in faultbase.py. A kind's module is imported when the kind is
first asked for (emulator/model/faults/table.py): a boot imports only those its engines name."""

from __future__ import annotations

from cmemu.emulator.engines.device.faultbase import Kind
from cmemu.emulator.model.faults.params import unknown_kind
from cmemu.emulator.model.faults.table import KindTable, ParamsTable

KINDS: KindTable[Kind] = KindTable(
    __name__,
    (
        "device-down",
        "broker-outage",
        "crash",
        "hang",
        "slow",
        "thermal-throttle",
        "intermittent-hang",
        "hbm-ecc",
        "sdc",
        "die-down",
        "pool-loss",
        "service-down",
        "ssd-loss",
        "clock-skew",
    ),
)
"""Every kind a device applies itself, by name."""

PARAMS = ParamsTable(KINDS)
"""Their params classes by kind: FaultState's `oneof params` (emulator/client/wire/faultparams.py
unpacks by it, and checks that it and the proto agree)."""


def kind_of(name: str) -> Kind:
    """A device kind by name; INVALID_ARGUMENT UNKNOWN_FAULT_KIND listing the known ones."""
    kind = KINDS.get(name)
    if kind is None:
        raise unknown_kind(name, KINDS, plane="device")
    return kind
