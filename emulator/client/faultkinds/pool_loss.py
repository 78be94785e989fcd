"""pool-loss: a memory pool is gone with its contents (its server too); it comes back empty."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import NoParams

KIND = DeviceKind(
    name="pool-loss",
    help="a memory pool and its contents are gone; it comes back empty",
    params=NoParams,
    target="a memory pool id",
    crash=True,
)
