"""sdc: silent data corruption of a region (or offset/size): reads of it succeed with bits
flipped (`mask`), and the device neither refuses nor counts them, as bit flips past ECC go
unnoticed. Only end-to-end checksums find it: EMS checks every copy it reads against the CRC-32
it kept at put, reads another replica and drops the bad one (emulator/engines/ems/reads.py)."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import SdcParams

KIND = DeviceKind(
    name="sdc",
    help="silent data corruption: a region's reads succeed with flipped bits; only checksums "
    "(EMS's CRCs) find it",
    params=SdcParams,
)
