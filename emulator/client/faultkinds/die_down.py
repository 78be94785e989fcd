"""die-down: one NPU die fails; work on it is UNAVAILABLE (DIE_DOWN), its health name
"<npu>.d<die>" is NOT_SERVING and the NPU stays SERVING, degraded."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import DieDownParams

KIND = DeviceKind(
    name="die-down",
    help="one die of an NPU fails; the NPU serves degraded",
    params=DieDownParams,
    target="an NPU id",
)
