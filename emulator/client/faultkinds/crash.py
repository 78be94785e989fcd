"""crash: the device's server is gone (port closed: UNAVAILABLE, connection refused) until the
fault clears; it comes back empty of volatile state, and of memory unless wipe=false."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import CrashParams

KIND = DeviceKind(
    name="crash",
    help="the device's server is gone; it restarts (memory wiped) when cleared",
    params=CrashParams,
    crash=True,
)
