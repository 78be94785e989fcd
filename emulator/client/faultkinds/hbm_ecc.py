"""hbm-ecc: an uncorrectable ECC error poisons a region (or offset/size): reads and atomics of it
fail DATA_LOSS (reason HBM_UNCORRECTABLE_ECC) and count in telemetry; writes heal it."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import HbmEccParams

KIND = DeviceKind(
    name="hbm-ecc",
    help="a region's bytes are poisoned: reads DATA_LOSS, writes heal; the manager takes the "
    "device out of service until none is left",
    params=HbmEccParams,
)
