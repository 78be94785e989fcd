"""device-down: the device reports NOT_SERVING and refuses UB and compute calls (UNAVAILABLE,
DEVICE_FAULTED); its server stays up. Its fault id is `dev:<device>`."""

from emulator.client.faultkinds.base import DeviceKind
from emulator.model.faults.catalogue import DeviceDownParams

KIND = DeviceKind(
    name="device-down",
    help="a device reports NOT_SERVING and refuses UB and compute calls",
    params=DeviceDownParams,
)
