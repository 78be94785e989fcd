"""thermal-throttle: a node runs hot and every NPU of it computes at `compute` of its speed (a
correlated gray failure: one cooling loop, eight slow ranks). Each NPU applies it as slow's
effect without the ports (slow.py), so kernels, and the collectives its dies are ranks of, run
at the throttled pace; slowdowns compound. The client's kind of this name sets it on every NPU
of a node at once, with one fault id `node:<node>:thermal-throttle`
(emulator/client/faultkinds/thermal_throttle.py)."""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.engines.device.faultbase import Kind
from cmemu.emulator.engines.device.kinds.slow import Slow
from cmemu.emulator.model.faults.params import FRACTION, param
from cmemu.emulator.model.topology import DeviceKind


@dataclass(frozen=True, kw_only=True)
class ThermalThrottleParams:
    compute: float = param(
        0.6, "share of kernel throughput every NPU of the node keeps, in (0, 1)", FRACTION
    )


KIND = Kind(
    name="thermal-throttle",
    help="a node runs hot: every NPU of it computes at a share of its speed",
    params=ThermalThrottleParams,
    effect=Slow(),
    on=frozenset({DeviceKind.NPU}),
    target="an NPU id",
    one_device=False,
)
