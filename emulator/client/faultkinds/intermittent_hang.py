"""intermittent-hang: the device hangs (accepts calls, answers none, health included) for
`hang_s` at the start of every `period_s`, counted from the injection in emulated time, and
answers again by itself in between, until the fault clears. The device's process runs the
windows (emulator/engines/device/gray.py); a hung NPU holds the collectives it is a rank of."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import IntermittentHangParams

KIND = DeviceKind(
    name="intermittent-hang",
    help="the device hangs for hang_s every period_s and recovers by itself, until cleared",
    params=IntermittentHangParams,
)
