"""A fabric or gateway fault carries its kind's typed params object, never a catch-all record
(issue 18 item 3): FaultSpec.params, RdmaFault.params. The wire maps that object onto the kind's
message in the fault's `oneof params` and back, field by field, with one function for every kind
(emulator/client/wire/faultparams.py). Here every kind of both tables goes out with each field
off its default (so that a field the receiver defaulted would show) and comes back equal, as
bytes and through a real fabric. The must-fail twin: a params class with a field its wire
message lacks is caught, refused as it is packed rather than sent short."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from cmemu.emulator.client.wire import fabric as fabric_wire
from cmemu.emulator.client.wire import gateway as gateway_wire
from cmemu.emulator.model.faults import fabric, gateway
from cmemu.emulator.model.faults.fabric import FaultSpec
from cmemu.emulator.model.faults.params import FRACTION, param, rechecked
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.emulator.testing import Clients
from cmemu.v1 import fabric_pb2, gateway_pb2


def example(cls: type[Any], kind: str) -> Any:
    """`cls` with every field off its default and in its range (a value the kind's own checks
    take), so that a field the wire dropped, which the receiver would default, shows."""
    hints = typing.get_type_hints(cls)
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        default = None if f.default is dataclasses.MISSING else f.default
        hint = hints[f.name]
        if hint is bool:
            values[f.name] = not default
        elif hint is int:
            values[f.name] = (default or 0) + 1
        elif hint is float:  # in (0, 1): every range a float param has takes it
            values[f.name] = 0.75 if default == 0.25 else 0.25
        else:
            values[f.name] = f"{f.name}-x"
        assert values[f.name] != default, (kind, f.name)
    return rechecked(cls(**values), kind=kind)


def fabric_through_wire(kind: str, params: object) -> object:
    """A FaultSpec of `kind` out as a FabricFault, across as bytes, and back; its params."""
    spec: FaultSpec[Any] = FaultSpec(
        kind=kind, params=params, target="x", id="f7", since_s=1.5, for_s=3.0
    )
    sent = fabric_wire.fault_proto(spec).SerializeToString()
    back = fabric_wire.fault_spec(fabric_pb2.FabricFault.FromString(sent))
    assert dataclasses.replace(back, params=params) == spec, kind  # what every fault has
    return back.params


def gateway_through_wire(kind: str, params: object) -> object:
    """An RdmaFault of `kind` out as a GatewayFault, across as bytes, and back; its params."""
    fault: RdmaFault[Any] = RdmaFault(
        kind=kind, params=params, target="x", id="r7", since_s=1.5, for_s=3.0
    )
    sent = gateway_wire.fault_proto(fault).SerializeToString()
    back = gateway_wire.fault(gateway_pb2.GatewayFault.FromString(sent))
    assert dataclasses.replace(back, params=params) == fault, kind
    return back.params


Through = Callable[[str, object], object]


def round_trip_problems(table: Mapping[str, type[Any]], through: Through) -> list[str]:
    """Each kind of `table` whose params do not come back whole, and why (empty: all do)."""
    problems = []
    for kind, cls in table.items():
        params = example(cls, kind)
        try:
            back = through(kind, params)
        except (TypeError, ValueError) as exc:
            problems.append(f"{kind}: {exc}")
            continue
        if type(back) is not cls or back != params:
            problems.append(f"{kind}: sent {params}, got {back}")
    return problems


WIRES: list[tuple[str, Mapping[str, type[Any]], Through]] = [
    ("fabric", fabric.PARAMS, fabric_through_wire),
    ("gateway", gateway.PARAMS, gateway_through_wire),
]


@pytest.mark.parametrize(("name", "table", "through"), WIRES, ids=[w[0] for w in WIRES])
def test_every_kind_s_params_come_back_whole(
    name: str, table: Mapping[str, type[Any]], through: Through
) -> None:
    assert list(table) == list({"fabric": fabric, "gateway": gateway}[name].KINDS)
    assert round_trip_problems(table, through) == []


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinkDegradedParams:
    """link-degraded's params grown a field its wire message (LinkDegradedParams) lacks."""

    factor: float = param(help="share left", check=FRACTION)
    burst_s: float = param(0.5, "a field no message carries")


@pytest.mark.parametrize(("name", "table", "through"), WIRES, ids=[w[0] for w in WIRES])
def test_a_params_field_the_wire_lacks_is_caught(
    name: str, table: Mapping[str, type[Any]], through: Through
) -> None:
    """The must-fail twin: the drifted class, in either table, is refused as it is packed."""
    kind = "link-degraded" if name == "fabric" else "link-slow"
    drifted = {**table, kind: LinkDegradedParams}
    assert round_trip_problems(drifted, through) == [
        f"{kind}: LinkDegradedParams.burst_s has no field in LinkDegradedParams"
    ]


TARGETS = {
    "link-down": "n00-npu0.d0~n00-l1s0", "link-degraded": "n00-npu0.d0~n00-l1s0",
    "link-latency": "n00-npu0.d0~n00-l1s0", "switch-down": "l2-p0-s0", "partition": "",
    "link-flap": "n00-npu0.d0~n00-l1s0", "link-loss": "n00-npu0.d0~n00-l1s0",
    "optical-module": "n00-l1s2", "l1-board": "n01", "ports-degraded": "n00-npu1",
    "rank-down": "n00-npu1", "rank-hung": "n00-npu1", "rank-slow": "n00-npu1",
}  # fmt: skip
SIDES = {"side_a": "n00-npu0,n00-npu1", "side_b": "n01-npu0"}


async def test_every_fabric_kind_is_listed_by_a_real_fabric_as_it_was_added(
    clients: Clients,
) -> None:
    """One fault of each kind into the running fabric (InjectFault), then ListFaults: each
    comes back with the params it was given, typed as its kind's."""
    assert set(TARGETS) == set(fabric.KINDS)
    stub = clients.fabric()
    sent: dict[str, object] = {}
    try:
        for kind, cls in fabric.PARAMS.items():
            params = example(cls, kind)
            if kind == "partition":
                params = dataclasses.replace(params, **SIDES)
            spec: FaultSpec[Any] = FaultSpec(kind=kind, params=params, target=TARGETS[kind])
            stored = await stub.InjectFault(fabric_wire.fault_proto(spec))
            sent[stored.id] = params
        listed = await stub.ListFaults(fabric_pb2.ListFaultsRequest())
        back = {f.id: fabric_wire.fault_spec(f).params for f in listed.faults}
        assert back == sent and len(back) == len(fabric.KINDS)
    finally:
        await stub.ClearFault(fabric_pb2.ClearFaultRequest(all=True))
