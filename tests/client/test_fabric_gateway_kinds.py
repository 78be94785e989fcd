"""The fabric's and the gateway's kinds are one module each (issue 18 item 3): each table
(emulator/model/faults/fabric, .../gateway KINDS) holds exactly the KIND records of its
package's modules, each in the module named after it, and every table made from it (the wire's
params, the plane's effects, the client's catalogue) is that table again. The must-fail twins:
a table that lost a module, gained a foreign record or holds a kind under another module's
name is caught, and so is a client record that drifted from its module."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import pytest

from cmemu.emulator.client.faultkinds import fabric as fabric_client
from cmemu.emulator.client.faultkinds import gateway as gateway_client
from cmemu.emulator.client.faultkinds.fabric import FabricKind
from cmemu.emulator.client.faultkinds.gateway import GatewayKind
from cmemu.emulator.client.faults import KINDS as CATALOGUE
from cmemu.emulator.model.faults import fabric, gateway
from cmemu.emulator.model.faults.fabric import link_loss
from cmemu.emulator.model.faults.gateway import link_slow

SHARED = {"base"}  # what every kind shares: no kind


def kind_modules(package: ModuleType) -> dict[str, ModuleType]:
    """The package's kind modules by name (every module but base)."""
    return {
        info.name: importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if info.name not in SHARED
    }


def table_problems(package: ModuleType, table: Mapping[str, Any]) -> list[str]:
    """How `table` differs from the KIND records of `package`'s modules (empty when it is
    exactly them): a module whose KIND is missing from it, a record of no module of the
    package, a kind under another module's name, a module without a KIND."""
    problems: list[str] = []
    modules = kind_modules(package)
    records = {}
    for name, module in modules.items():
        kind = getattr(module, "KIND", None)
        if kind is None:
            problems.append(f"{name}: no KIND")
            continue
        records[id(kind)] = name
        if kind.name.replace("-", "_") != name:
            problems.append(f"{name}: declares {kind.name}")
        if table.get(kind.name) is not kind:
            problems.append(f"{name}: {kind.name} is not in the table")
    for key, kind in table.items():
        if id(kind) not in records:
            problems.append(f"{key}: in the table but no module's")
        elif key != kind.name:
            problems.append(f"{key}: the table names {kind.name} so")
    return problems


@pytest.mark.parametrize("package", [fabric, gateway], ids=["fabric", "gateway"])
def test_the_table_is_exactly_the_modules(package: ModuleType) -> None:
    assert table_problems(package, package.KINDS) == []
    assert list(package.PARAMS) == list(package.KINDS)
    assert all(package.PARAMS[n] is k.params for n, k in package.KINDS.items())


def test_a_table_that_drifted_from_its_modules_is_caught() -> None:
    """The must-fail twin: a module left out, a foreign record, a kind under another name."""
    fewer = {n: k for n, k in fabric.KINDS.items() if n != "link-loss"}
    assert table_problems(fabric, fewer) == ["link_loss: link-loss is not in the table"]
    foreign = {**gateway.KINDS, "link-loss": link_loss.KIND}
    assert table_problems(gateway, foreign) == ["link-loss: in the table but no module's"]
    renamed = dataclasses.replace(link_slow.KIND, name="link-slower")
    swapped = {**gateway.KINDS, "link-slow": renamed}
    assert table_problems(gateway, swapped) == [
        "link_slow: link-slow is not in the table",
        "link-slow: in the table but no module's",
    ]


def test_the_plane_takes_every_gateway_kind_but_the_gateway_s_own() -> None:
    assert list(gateway.PLANE) == [n for n in gateway.KINDS if n != "gateway-down"]
    assert all(gateway.PLANE[n] is gateway.KINDS[n].effect for n in gateway.PLANE)
    assert gateway.KINDS["gateway-down"].effect is None


def test_the_client_s_kinds_are_made_from_their_modules() -> None:
    """Every fabric kind a user adds and every gateway kind is in the catalogue exactly as its
    module declares it; the kinds only a device's fault sets at the fabric are not there."""
    for name, kind in fabric.KINDS.items():
        if kind.from_device:
            assert name not in CATALOGUE and name not in fabric_client.KINDS, name
        else:
            assert CATALOGUE[name] == FabricKind.of(kind), name
    for gkind in gateway.KINDS.values():
        assert CATALOGUE[gkind.catalogue] == GatewayKind.of(gkind), gkind.name
        assert gateway_client.catalogue_name(gkind.name) == gkind.catalogue
    assert gateway_client.catalogue_name("meteor") == "rdma-meteor"  # a newer gateway's


def test_a_client_record_that_drifted_is_not_its_module_s() -> None:
    """The must-fail twin: a record whose help, params or wire name moved is told apart."""
    degraded = FabricKind.of(fabric.KINDS["link-degraded"])
    assert dataclasses.replace(degraded, help="other") != degraded
    slow = GatewayKind.of(gateway.KINDS["link-slow"])
    assert dataclasses.replace(slow, wire="switch-slow") != CATALOGUE["rdma-link-slow"]
