"""The fabric's fault kinds: one module each, holding the kind's whole story (its typed params
and their checks, its help and what its TARGET names, its effect on the link graph, reading
those params as they are), and this one table of them. The link graph's FaultSet
(emulator/model/linkfaults.py), the wire's params table (FabricFault's `oneof params`,
emulator/client/wire/fabric.py) and the client's fabric kinds (emulator/client/faultkinds/
fabric.py) are all made from KINDS; what the kinds share lives in base.py. A kind's module is
imported when the kind is first asked for (table.py): a boot imports only those its engines name."""

from __future__ import annotations

from typing import Any

from cmemu.emulator.model.faults.fabric.base import FaultSpec, Kind, NoParams, of_kind
from cmemu.emulator.model.faults.params import kind_params_checked, unknown_kind
from cmemu.emulator.model.faults.table import KindTable, ParamsTable

__all__ = ["KINDS", "PARAMS", "FaultSpec", "Kind", "NoParams", "checked", "kind_of", "of_kind"]

KINDS: KindTable[Kind[Any]] = KindTable(
    __name__,
    (
        "link-down",
        "link-degraded",
        "link-latency",
        "switch-down",
        "partition",
        "link-flap",
        "link-loss",
        "optical-module",
        "l1-board",
        "ports-degraded",
        "rank-down",
        "rank-hung",
        "rank-slow",
    ),
)
"""Every kind the fabric applies to its link graph, by name (Fabric/InjectFault)."""

PARAMS = ParamsTable(KINDS)
"""Their params classes by kind: FabricFault's `oneof params` (emulator/client/wire/
faultparams.py unpacks by it, and checks that it and the proto agree)."""


def kind_of(name: str) -> Kind[Any]:
    """A fabric kind by name; INVALID_ARGUMENT UNKNOWN_FAULT_KIND listing the known ones."""
    kind = KINDS.get(name)
    if kind is None:
        raise unknown_kind(name, KINDS)
    return kind


def checked(spec: FaultSpec[Any]) -> FaultSpec[Any]:
    """`spec` if its kind is known and its params are that kind's, in their ranges (each field's
    and the class's own check, as when they were typed or unpacked: a spec built in process is
    checked too): the one place a fabric fault's params are checked before it is stored."""
    kind_params_checked(spec.params, kind_of(spec.kind).params, kind=spec.kind)
    return spec
