"""slow: kernels run at `compute` of their throughput, and the device's UB ports keep `link` of
their bandwidth (a fabric `ports-degraded` fault, cleared with it)."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import SlowParams

KIND = DeviceKind(
    name="slow", help="kernels and/or the device's UB ports run at a share", params=SlowParams
)
