"""The typed parameters of the fabric's and the gateway's fault kinds: one frozen dataclass per
kind, registered by name. Every other kind holds its own in its module: a device's in
emulator/engines/device/kinds/ (KINDS), the orchestrator's (service, container, process, power,
checkpoint) in emulator/client/faultkinds/.

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


PARAMS: dict[str, type[Any]] = {
    "link-loss": LinkLossParams,
    "optical-module": OpticalModuleParams,
    "l1-board": NoParams,
    "link-flap": LinkFlapParams,
    "link-down": NoParams,
    "link-degraded": LinkDegradedParams,
    "link-latency": LinkLatencyParams,
    "switch-down": NoParams,
    "partition": PartitionParams,
}
"""The parameters of the client catalogue's fabric kinds, by kind name (FABRIC_PARAMS adds the
kinds only devices set at the fabric)."""


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
