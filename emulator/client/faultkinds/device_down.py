"""device-down: the device reports NOT_SERVING and refuses UB and compute calls (UNAVAILABLE,
DEVICE_FAULTED); its server stays up. Its fault id is `dev:<device>`."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import DeviceDownParams

KIND = DeviceKind(
    name="device-down",
    help="a device reports NOT_SERVING and refuses UB and compute calls",
    params=DeviceDownParams,
)
