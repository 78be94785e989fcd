"""pool-loss: a memory pool crashes with its contents lost (its server too, as a crash); it comes
back empty when the fault clears, and EMS re-replicates what it held."""

from __future__ import annotations

from cmemu.emulator.engines.device.faultbase import Kind
from cmemu.emulator.engines.device.kinds.crash import Crash
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.topology import DeviceKind

KIND = Kind(
    name="pool-loss",
    help="a memory pool and its contents are gone; it comes back empty",
    params=NoParams,
    effect=Crash(wipe_always=True),
    on=frozenset({DeviceKind.MEMPOOL}),
    target="a memory pool id",
    crash=True,
)
