"""The fabric's fault kinds: one module each, holding the kind's whole story (its typed params
and their checks, its help and what its TARGET names, its effect on the link graph, and how its
params map onto the graph's FaultSpec), and this one table of them. The link graph's FaultSet
(emulator/model/linkfaults.py), the wire's params table (FabricFault's `oneof params`,
emulator/client/wire/fabric.py) and the client's fabric kinds (emulator/client/faultkinds/
fabric.py) are all made from KINDS; what the kinds share lives in base.py."""

from __future__ import annotations

from typing import Any

from cmemu.emulator.model.faults.fabric import (
    l1_board,
    link_degraded,
    link_down,
    link_flap,
    link_latency,
    link_loss,
    optical_module,
    partition,
    ports_degraded,
    rank_down,
    rank_hung,
    rank_slow,
    switch_down,
)
from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind
from cmemu.emulator.model.faults.params import params_from, unknown_kind

__all__ = ["KINDS", "PARAMS", "FaultSpec", "Kind", "kind_of", "spec_fields", "spec_params"]

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        link_down.KIND,
        link_degraded.KIND,
        link_latency.KIND,
        switch_down.KIND,
        partition.KIND,
        link_flap.KIND,
        link_loss.KIND,
        optical_module.KIND,
        l1_board.KIND,
        ports_degraded.KIND,
        rank_down.KIND,
        rank_hung.KIND,
        rank_slow.KIND,
    )
}
"""Every kind the fabric applies to its link graph, by name (Fabric/InjectFault)."""

PARAMS: dict[str, type[Any]] = {name: k.params for name, k in KINDS.items()}
"""Their params classes by kind: FabricFault's `oneof params` (emulator/client/wire/
faultparams.py unpacks by it, and checks that it and the proto agree)."""


def kind_of(name: str) -> Kind:
    """A fabric kind by name; INVALID_ARGUMENT UNKNOWN_FAULT_KIND listing the known ones."""
    kind = KINDS.get(name)
    if kind is None:
        raise unknown_kind(name, KINDS)
    return kind


def spec_params(spec: FaultSpec) -> Any | None:
    """The typed parameters of a spec of a known kind (None for another), checked as the kind's
    dataclass states them: the one place a fabric fault's ranges are checked."""
    kind = KINDS.get(spec.kind)
    if kind is None:
        return None
    return params_from(kind.params, kind.of_spec(spec), kind=spec.kind)


def spec_fields(kind: str, params: object) -> dict[str, Any]:
    """A kind's typed parameters as FaultSpec fields ({} for an unknown kind: the fabric names
    it)."""
    known = KINDS.get(kind)
    return {} if known is None else known.to_spec(params)
