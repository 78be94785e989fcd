"""The typed parameters of the fabric's and the gateway's fault kinds (and of the orchestrator's
that have no module of their own yet): one frozen dataclass per kind, registered by name. A
device's kinds hold theirs in their own modules (emulator/engines/device/kinds/, KINDS).

A field's metadata carries its help and its range (emulator/model/faults/params.py checks it);
a `check()` method holds the rules that span fields. Shares (`compute`, `link`, `factor`) are
what remains of a rate, in (0, 1], like the fabric's link-degraded factor: 0.5 is half speed.

On the wire each dataclass is a message of the same name, fields and types
(protos/cmemu/v1/faultparams.proto), in the `oneof params` of the fault message of whoever
applies the kind: the device kinds' (Device's FaultState), FABRIC_PARAMS (FabricFault),
GATEWAY_PARAMS (GatewayFault); emulator/client/wire/faultparams.py converts, and checks that the
two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cmemu.emulator.model.faults.params import (
    AT_LEAST_ZERO,
    FRACTION,
    POSITIVE,
    NoParams,
    invalid,
    param,
)

__all__ = ["FABRIC_PARAMS", "GATEWAY_PARAMS", "PARAMS", "NoParams", "param"]


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
    "link-loss": LinkLossParams,
    "optical-module": OpticalModuleParams,
    "l1-board": NoParams,
    "checkpoint-corrupt": NoParams,
    "link-flap": LinkFlapParams,
    "process-kill": NoParams,
    "process-pause": NoParams,
    "link-down": NoParams,
    "link-degraded": LinkDegradedParams,
    "link-latency": LinkLatencyParams,
    "switch-down": NoParams,
    "partition": PartitionParams,
    "service-kill": NoParams,
    "service-hang": NoParams,
    "service-slow": ServiceSlowParams,
    "service-partition": NoParams,
    "container-kill": ContainerKillParams,
    "container-pause": NoParams,
    "container-restart": ContainerStopParams,
    "container-stop": ContainerStopParams,
    "container-disconnect": NoParams,
    "container-netem": NetemParams,
}
"""The parameters of the catalogue's kinds that no module of their own holds, by kind name."""


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
