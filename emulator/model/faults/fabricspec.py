"""A fabric fault's typed parameters <-> the link graph's fault record (FaultSpec).

The catalogue states each fabric kind's parameters as a dataclass (FABRIC_PARAMS); the link
graph's kinds (emulator/model/linkfaults.py) read a flat FaultSpec, in the graph's units
(seconds, tuples of ids). `spec_fields` and `spec_params` (the link graph's, which checks
them) are where the two meet, used by the wire layer at both ends and in process alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cmemu.emulator.model.faults.catalogue import (
    LinkFlapParams,
    LinkLatencyParams,
    LinkLossParams,
    OpticalModuleParams,
    PartitionParams,
)
from cmemu.emulator.model.linkfaults import FaultSpec, spec_params

__all__ = ["FaultSpec", "spec_fields", "spec_params"]


def _sides(text: str) -> tuple[str, ...]:
    return tuple(s for s in (x.strip() for x in text.split(",")) if s)


Convert = Callable[[Any], dict[str, Any]]
TO_SPEC: dict[type[Any], Convert] = {
    LinkLatencyParams: lambda p: {"added_latency_s": p.latency_us / 1e6},
    LinkFlapParams: lambda p: {"period_s": p.period_s, "duty": p.duty},
    PartitionParams: lambda p: {
        "side_a": _sides(p.side_a),
        "side_b": _sides(p.side_b),
        "one_way": p.one_way,
    },
    LinkLossParams: lambda p: {"loss_rate": p.rate},
    OpticalModuleParams: lambda p: {"module": p.module},
}
"""The params whose fields are not FaultSpec's own (others: none, or `factor`)."""


def _factor(obj: Any) -> dict[str, Any]:
    """link-degraded, ports-degraded, rank-slow: a `factor` on both sides; others: nothing."""
    return {"factor": obj.factor} if hasattr(obj, "factor") else {}


def spec_fields(params: object) -> dict[str, Any]:
    """A kind's typed parameters as FaultSpec fields."""
    return TO_SPEC.get(type(params), _factor)(params)
