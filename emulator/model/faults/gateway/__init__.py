"""The RDMA scale-out plane's fault kinds, as the gateway's API names them: one module each,
holding the kind's whole story (its typed params, its help and what its TARGET names, its name
in the user's catalogue, its effect on the plane's graph, reading those params as they are), and
this one table of them. The plane's RdmaFaultSet
(emulator/model/rdmagraph.py), the wire's params table (GatewayFault's `oneof params`,
emulator/client/wire/gateway.py) and the client's RDMA kinds (emulator/client/faultkinds/
gateway.py) are all made from KINDS; what the kinds share lives in base.py."""

from __future__ import annotations

from typing import Any

from cmemu.emulator.model.faults.gateway import (
    gateway_down,
    link_down,
    link_slow,
    partition,
    switch_down,
    switch_slow,
)
from cmemu.emulator.model.faults.gateway.base import Effect, Kind, NoParams, of_kind
from cmemu.emulator.model.faults.params import kind_params_checked, unknown_kind
from cmemu.emulator.model.rdmafault import RdmaFault

__all__ = ["KINDS", "PARAMS", "PLANE", "Kind", "NoParams", "checked", "of_kind", "plane_kind"]

KINDS: dict[str, Kind[Any]] = {
    k.name: k
    for k in (
        link_down.KIND,
        link_slow.KIND,
        switch_down.KIND,
        switch_slow.KIND,
        gateway_down.KIND,
        partition.KIND,
    )
}
"""Every kind a gateway takes (Gateway/InjectFault), by its name on the gateway's API."""

PLANE: dict[str, Effect[Any]] = {
    name: k.effect for name, k in KINDS.items() if k.effect is not None
}
"""The kinds the plane's timing authority applies to its graph (all but gateway-down)."""

PARAMS: dict[str, type[Any]] = {name: k.params for name, k in KINDS.items()}
"""Their params classes by kind: GatewayFault's `oneof params` (emulator/client/wire/
faultparams.py unpacks by it, and checks that it and the proto agree)."""


def plane_kind(name: str) -> Effect[Any]:
    """A plane kind's effect by name; INVALID_ARGUMENT UNKNOWN_FAULT_KIND listing the plane's."""
    effect = PLANE.get(name)
    if effect is None:
        raise unknown_kind(name, PLANE, plane="RDMA plane")
    return effect


def checked(fault: RdmaFault[Any]) -> RdmaFault[Any]:
    """`fault` if its kind is known and its params are that kind's, in their ranges (each
    field's and the class's own check, as when they were typed or unpacked: a fault built in
    process is checked too): the one place a plane fault's params are checked before it is
    stored."""
    kind = KINDS.get(fault.kind)
    if kind is None:
        raise unknown_kind(fault.kind, PLANE, plane="RDMA plane")
    kind_params_checked(fault.params, kind.params, kind=fault.kind)
    return fault
