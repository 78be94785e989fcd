"""clock-skew: the clock of a device's process reads wrong, a step `offset_s` (positive ahead,
negative behind) and a rate error `drift_ppm`, until cleared. The device's process applies it
(emulator/engines/device/clockskew.py says what "the process" is in each launch mode and why):
its events, telemetry and liveness beats carry the skewed stamps, and the durations it keeps end
early or late by the step. One fault per process: a second device of a skewed process is
refused (FAILED_PRECONDITION FAULT_ALREADY_ACTIVE)."""

from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.model.faults.catalogue import ClockSkewParams

KIND = DeviceKind(
    name="clock-skew",
    help="the clock of a device's process reads offset_s off and drifts drift_ppm, until cleared",
    params=ClockSkewParams,
    target="a device id (its process's clock: the node's in procs mode, the device's in process)",
)
