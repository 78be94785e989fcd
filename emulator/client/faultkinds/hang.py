"""hang: the device accepts every call and answers none, its health Check included, until the
fault clears (a heartbeat's deadline finds it); its fault methods still answer."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import NoParams

KIND = DeviceKind(
    name="hang", help="the device accepts calls and never answers (health too)", params=NoParams
)
