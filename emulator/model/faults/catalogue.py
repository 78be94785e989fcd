"""Every fault kind's typed parameters: one frozen dataclass per kind, registered by name.

A field's metadata carries its help and its range (emulator/model/faults/params.py checks it);
a `check()` method holds the rules that span fields. Shares (`compute`, `link`, `factor`) are
what remains of a rate, in (0, 1], like the fabric's link-degraded factor: 0.5 is half speed.

On the wire each dataclass is a message of the same name, fields and types
(protos/cmemu/v1/faultparams.proto), in the `oneof params` of the fault message of whoever
applies the kind: DEVICE_PARAMS (Device's FaultState), FABRIC_PARAMS (FabricFault),
GATEWAY_PARAMS (GatewayFault); emulator/client/wire/faultparams.py converts, and checks that the
two agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.faults.params import AT_LEAST_ZERO, FRACTION, POSITIVE, SHARE, invalid
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.naming import SERVICES


def param(default: Any = None, help: str = "", check: dict[str, str] | None = None) -> Any:
    """A parameter with its help and range; no default makes it required."""
    metadata = {"help": help, **(check or {})}
    if default is None:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class NoParams:
    """A kind that takes no parameters."""


@dataclass(frozen=True, kw_only=True)
class CrashParams:
    wipe: bool = param(
        True,
        "the restart loses memory contents and regions (a reset reinitialises HBM/DRAM); "
        "false keeps them, as a process restart over persistent memory would",
    )


@dataclass(frozen=True, kw_only=True)
class SlowParams:
    compute: float = param(0.5, "share of kernel throughput left, in (0, 1]", SHARE)
    link: float = param(1.0, "share of its ports' bandwidth left, in (0, 1]", SHARE)

    def check(self) -> None:
        if self.compute == 1.0 and self.link == 1.0:
            raise invalid("slow", "compute", "or link must be below 1 (nothing would slow)")


@dataclass(frozen=True, kw_only=True)
class ThermalThrottleParams:
    compute: float = param(
        0.6, "share of kernel throughput every NPU of the node keeps, in (0, 1)", FRACTION
    )


@dataclass(frozen=True, kw_only=True)
class IntermittentHangParams:
    period_s: float = param(60.0, "emulated seconds from one hang to the next", POSITIVE)
    hang_s: float = param(5.0, "emulated seconds each hang lasts, less than period_s", POSITIVE)

    def check(self) -> None:
        shortest = DEFAULT_PROFILE.limits.fault_window_min_s
        if self.hang_s < shortest:
            raise invalid("intermittent-hang", "hang_s", f"must be at least {shortest:g} s")
        if self.period_s - self.hang_s < shortest:
            raise invalid(
                "intermittent-hang",
                "hang_s",
                f"must be below period_s by at least {shortest:g} s (else it is a hang)",
            )


@dataclass(frozen=True, kw_only=True)
class ClockSkewParams:
    offset_s: float = param(
        0.0, "emulated seconds the process's clock reads off: positive ahead, negative behind"
    )
    drift_ppm: float = param(
        0.0, "its rate error from the injection on, parts per million: positive runs fast"
    )

    def check(self) -> None:
        limits = DEFAULT_PROFILE.limits
        if abs(self.offset_s) > limits.clock_skew_max_s:
            raise invalid(
                "clock-skew",
                "offset_s",
                f"must be within +-{limits.clock_skew_max_s:g} s, got {self.offset_s:g}",
            )
        if abs(self.drift_ppm) > limits.clock_drift_max_ppm:
            raise invalid(
                "clock-skew",
                "drift_ppm",
                f"must be within +-{limits.clock_drift_max_ppm:g} ppm, got {self.drift_ppm:g}",
            )
        if self.offset_s == 0 and self.drift_ppm == 0:
            raise invalid("clock-skew", "offset_s", "or drift_ppm must be set (nothing would skew)")


@dataclass(frozen=True, kw_only=True)
class HbmEccParams:
    region: int = param(
        0, "poison this region id (see ListRegions); 0: use offset/size", AT_LEAST_ZERO
    )
    offset: int = param(0, "first poisoned byte (UB address at the device)", AT_LEAST_ZERO)
    size: int = param(0, "poisoned bytes from offset", AT_LEAST_ZERO)

    def check(self) -> None:
        if (self.region == 0) == (self.size == 0):
            raise invalid("hbm-ecc", "region", "or size (with offset) is required, not both")


@dataclass(frozen=True, kw_only=True)
class SdcParams:
    region: int = param(
        0, "corrupt this region id (see ListRegions); 0: use offset/size", AT_LEAST_ZERO
    )
    offset: int = param(0, "first corrupted byte (UB address at the device)", AT_LEAST_ZERO)
    size: int = param(0, "corrupted bytes from offset", AT_LEAST_ZERO)
    mask: int = param(1, "bits flipped in every corrupted byte a read returns, 1 to 255", POSITIVE)

    def check(self) -> None:
        if (self.region == 0) == (self.size == 0):
            raise invalid("sdc", "region", "or size (with offset) is required, not both")
        if self.mask > 0xFF:
            raise invalid("sdc", "mask", f"is one byte's bits: 1 to 255, got {self.mask}")


@dataclass(frozen=True, kw_only=True)
class DieDownParams:
    die: int = param(0, "the NPU die that fails (0 or 1)", AT_LEAST_ZERO)


@dataclass(frozen=True, kw_only=True)
class LinkFlapParams:
    period_s: float = param(10.0, "emulated seconds of one down+up cycle", POSITIVE)
    duty: float = param(0.5, "share of each period the link is down, in (0, 1)", FRACTION)


@dataclass(frozen=True, kw_only=True)
class LinkDegradedParams:
    factor: float = param(help="share of the link's bandwidth left, in (0, 1)", check=FRACTION)


@dataclass(frozen=True, kw_only=True)
class LinkLatencyParams:
    latency_us: float = param(
        help="emulated microseconds added per crossing, (0, 1e6]", check=POSITIVE
    )

    def check(self) -> None:
        if self.latency_us > 1e6:
            raise invalid(
                "link-latency", "latency_us", f"must be at most 1e6, got {self.latency_us:g}"
            )


@dataclass(frozen=True, kw_only=True)
class LinkLossParams:
    rate: float = param(
        help="share of the link's frames lost or failing CRC, in (0, 1); each is retransmitted",
        check=FRACTION,
    )


@dataclass(frozen=True, kw_only=True)
class OpticalModuleParams:
    module: int = param(
        0,
        "which of the L1 chip's uplink modules fails, from 0; each carries "
        "switch.uplinks_per_optical_module uplinks, in L2 chip order",
        AT_LEAST_ZERO,
    )


@dataclass(frozen=True, kw_only=True)
class PartitionParams:
    side_a: str = param(help="comma-separated device ids on one side")
    side_b: str = param(help="comma-separated device ids on the other side")
    one_way: bool = param(
        False,
        "only side_a's frames to side_b are lost (an asymmetric partition): side_b's writes to "
        "side_a land but are never acknowledged, and side_a's requests never arrive",
    )


@dataclass(frozen=True, kw_only=True)
class PortsDegradedParams:
    """The fabric's ports-degraded, set by a device's slow fault (its link share)."""

    factor: float = param(help="share of the device's UB port bandwidth left, in (0, 1)",
                          check=FRACTION)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class RankSlowParams:
    """The fabric's rank-slow, set by an NPU's slow or thermal-throttle fault."""

    factor: float = param(help="share of the rank's compute speed left, in (0, 1)",
                          check=FRACTION)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class DeviceDownParams:
    reason: str = param("cmemu fault add", "the reason the device reports")


@dataclass(frozen=True, kw_only=True)
class ServiceDownParams:
    """service-kill and service-hang as the device that hosts them in its process applies them
    (the client kinds take the service as their target, no params)."""

    service: str = param(help="the service: fabric, ems, scheduler, router, manager, gateway")
    hang: bool = param(False, "accept calls and answer none, instead of stopping the server")
    latency_ms: float = param(
        0.0, "instead: answer every call this many emulated ms late (service-slow)", AT_LEAST_ZERO
    )
    partition: bool = param(
        False,
        "instead: cut it off the network (service-partition): nothing reaches it and it reaches "
        "nothing, its work going on",
    )

    def check(self) -> None:
        if self.service not in SERVICES:
            raise invalid(
                "service-down", "service", f"{self.service!r} is none of {', '.join(SERVICES)}"
            )
        if self.hang and self.latency_ms:
            raise invalid(
                "service-down", "latency_ms", "a hung service answers nothing: no latency"
            )
        if self.partition and (self.hang or self.latency_ms):
            raise invalid(
                "service-down", "partition", "is a way down of its own: not with hang or latency_ms"
            )


@dataclass(frozen=True, kw_only=True)
class ServiceSlowParams:
    latency_ms: float = param(
        help="emulated milliseconds every call to the service waits before it is handled",
        check=POSITIVE,
    )


@dataclass(frozen=True, kw_only=True)
class ContainerKillParams:
    signal: str = param("KILL", "the signal docker kill sends (KILL, TERM, ...)")

    def check(self) -> None:
        if not self.signal.isalnum() or self.signal != self.signal.upper():
            raise invalid("container-kill", "signal", f"{self.signal!r} is not a signal name")


@dataclass(frozen=True, kw_only=True)
class ContainerStopParams:
    grace_s: float = param(
        10.0, "wall seconds between SIGTERM and SIGKILL (the emulator drains on SIGTERM)",
        AT_LEAST_ZERO,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class NetemParams:
    delay_ms: float = param(0.0, "wall milliseconds added to every packet it sends", AT_LEAST_ZERO)
    jitter_ms: float = param(0.0, "+- this much on the delay", AT_LEAST_ZERO)
    loss_pct: float = param(0.0, "percent of its packets lost, [0, 100]", AT_LEAST_ZERO)

    def check(self) -> None:
        if self.loss_pct > 100:
            raise invalid("container-netem", "loss_pct", "is a percentage: at most 100")
        if not self.delay_ms and not self.loss_pct:
            raise invalid("container-netem", "delay_ms", "or loss_pct must be set")
        if self.jitter_ms and not self.delay_ms:
            raise invalid("container-netem", "jitter_ms", "needs delay_ms")


PARAMS: dict[str, type[Any]] = {
    "crash": CrashParams,
    "hang": NoParams,
    "slow": SlowParams,
    "thermal-throttle": ThermalThrottleParams,
    "intermittent-hang": IntermittentHangParams,
    "clock-skew": ClockSkewParams,
    "link-loss": LinkLossParams,
    "optical-module": OpticalModuleParams,
    "l1-board": NoParams,
    "hbm-ecc": HbmEccParams,
    "sdc": SdcParams,
    "checkpoint-corrupt": NoParams,
    "die-down": DieDownParams,
    "link-flap": LinkFlapParams,
    "node-power-off": CrashParams,
    "rack-power-off": CrashParams,
    "process-kill": NoParams,
    "process-pause": NoParams,
    "pool-loss": NoParams,
    "broker-outage": NoParams,
    "link-down": NoParams,
    "link-degraded": LinkDegradedParams,
    "link-latency": LinkLatencyParams,
    "switch-down": NoParams,
    "partition": PartitionParams,
    "device-down": DeviceDownParams,
    "service-kill": NoParams,
    "service-hang": NoParams,
    "service-slow": ServiceSlowParams,
    "service-partition": NoParams,
    "service-down": ServiceDownParams,
    "ssd-loss": NoParams,
    "container-kill": ContainerKillParams,
    "container-pause": NoParams,
    "container-restart": ContainerStopParams,
    "container-stop": ContainerStopParams,
    "container-disconnect": NoParams,
    "container-netem": NetemParams,
}
"""The parameters of every kind of the catalogue, by kind name."""


DEVICE_PARAMS: dict[str, type[Any]] = {
    k: PARAMS[k]
    for k in (
        "device-down",
        "broker-outage",
        "crash",
        "hang",
        "slow",
        "thermal-throttle",
        "intermittent-hang",
        "hbm-ecc",
        "sdc",
        "die-down",
        "pool-loss",
        "service-down",
        "ssd-loss",
        "clock-skew",
    )
}
"""The kinds a device applies itself (Device/InjectFault: FaultState's `oneof params`)."""

FABRIC_PARAMS: dict[str, type[Any]] = {
    **{
        k: PARAMS[k]
        for k in (
            "link-down",
            "link-degraded",
            "link-latency",
            "switch-down",
            "partition",
            "link-flap",
            "link-loss",
            "optical-module",
            "l1-board",
        )
    },
    "ports-degraded": PortsDegradedParams,
    "rank-down": NoParams,
    "rank-hung": NoParams,
    "rank-slow": RankSlowParams,
}
"""The kinds the fabric applies to its link graph (Fabric/InjectFault: FabricFault's)."""

GATEWAY_PARAMS: dict[str, type[Any]] = {
    "link-down": NoParams,
    "link-slow": LinkDegradedParams,
    "switch-down": NoParams,
    "switch-slow": LinkDegradedParams,
    "gateway-down": NoParams,
    "partition": NoParams,
}
"""The RDMA plane's kinds by their names on the gateway's API (Gateway/InjectFault:
GatewayFault's); the catalogue names them rdma-link-down, supernode-partition..."""
