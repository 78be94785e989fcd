"""Fault parameters on the wire (emulator/client/wire/faultparams.py): every kind's params
dataclass has its message in the oneof of its fault message, with the same fields and compatible
types, so the two cannot drift apart; and a dataclass that drifted is caught (its must-fail twin).
The conversion keeps every value and every default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor

from cmemu.emulator.client.faultkinds import fabric as fabric_kinds
from cmemu.emulator.client.faultkinds import gateway as gateway_kinds
from cmemu.emulator.client.faultkinds.base import DeviceKind
from cmemu.emulator.client.faults import KINDS
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.client.wire.device import fault_request
from cmemu.emulator.engines.device.kinds import KINDS as DEVICE_KINDS
from cmemu.emulator.engines.device.kinds import PARAMS as DEVICE_PARAMS
from cmemu.emulator.engines.device.kinds.crash import CrashParams
from cmemu.emulator.engines.device.kinds.hbm_ecc import HbmEccParams
from cmemu.emulator.engines.device.kinds.slow import SlowParams
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults.fabric import KINDS as FABRIC_KINDS
from cmemu.emulator.model.faults.fabric import PARAMS as FABRIC_PARAMS
from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.gateway import KINDS as GATEWAY_KINDS
from cmemu.emulator.model.faults.gateway import PARAMS as GATEWAY_PARAMS
from cmemu.emulator.model.faults.gateway import PLANE
from cmemu.emulator.model.faults.params import describe, param
from cmemu.v1 import device_pb2, fabric_pb2, faultparams_pb2, gateway_pb2

STATE = device_pb2.FaultState.DESCRIPTOR
WIRES: list[tuple[str, Mapping[str, type[Any]], Descriptor]] = [
    ("device", DEVICE_PARAMS, STATE),
    ("fabric", FABRIC_PARAMS, fabric_pb2.FabricFault.DESCRIPTOR),
    ("gateway", GATEWAY_PARAMS, gateway_pb2.GatewayFault.DESCRIPTOR),
]


@pytest.mark.parametrize(("name", "table", "message"), WIRES, ids=[w[0] for w in WIRES])
def test_every_kind_has_its_message_in_the_oneof(
    name: str, table: Mapping[str, type[Any]], message: Descriptor
) -> None:
    assert faultparams.drift(table, message) == []


def test_the_tables_are_every_registered_kind_that_travels() -> None:
    """Each wire's table holds exactly the kinds its owner applies, and every catalogue kind
    that travels as itself has the same params there as in the client's registry."""
    assert list(DEVICE_PARAMS) == list(DEVICE_KINDS)
    assert list(FABRIC_PARAMS) == list(FABRIC_KINDS)
    assert list(GATEWAY_PARAMS) == list(GATEWAY_KINDS)
    assert set(GATEWAY_PARAMS) == set(PLANE) | {"gateway-down"}
    for kind in KINDS.values():
        if isinstance(kind, gateway_kinds.GatewayKind):
            assert GATEWAY_PARAMS[kind.wire] is kind.params, kind.name
        elif isinstance(kind, fabric_kinds.FabricKind):
            assert FABRIC_PARAMS[kind.name] is kind.params, kind.name
        elif kind.name in DEVICE_PARAMS:
            assert DEVICE_PARAMS[kind.name] is kind.params, kind.name
            assert kind.help == DEVICE_KINDS[kind.name].help, kind.name


def test_the_client_s_device_kinds_are_made_from_their_modules() -> None:
    """A device kind a user adds to one device is in the client's catalogue exactly as its
    module declares it (name, help, params, target, crash), and the others are not there as
    one-device kinds (each has a client kind of its own, or none)."""
    for name, device_kind in DEVICE_KINDS.items():
        client = KINDS.get(name)
        if device_kind.one_device:
            assert client == DeviceKind.of(device_kind), name
        else:
            assert not isinstance(client, DeviceKind), name
    assert isinstance(KINDS["crash"], DeviceKind) and KINDS["crash"].crash
    assert KINDS["die-down"].target == "an NPU id"
    assert KINDS["thermal-throttle"].target.startswith("a node id")  # the node's, not the NPU's


def test_every_kind_documents_every_parameter() -> None:
    """What `cmemu fault kinds` prints: each parameter of every kind of the catalogue, wherever
    its module is (a device's, the fabric's, the orchestrator's), has its help."""
    for kind in KINDS.values():
        rows = describe(kind.params)
        assert all(help_ for *_, help_ in rows), kind.name
    assert [r[0] for r in describe(KINDS["container-netem"].params)] == [
        "delay_ms", "jitter_ms", "loss_pct"
    ]  # fmt: skip
    assert describe(KINDS["service-slow"].params)[0][2] is None  # latency_ms: required


@dataclass(frozen=True, kw_only=True)
class SlowParams2:  # SlowParams with a field the wire does not carry
    compute: float = param(0.5, "share of kernel throughput left")
    link: float = param(1.0, "share of its ports' bandwidth left")
    memory: float = param(1.0, "a field added to the dataclass only")


def test_a_dataclass_that_drifted_fails_the_check() -> None:
    """The must-fail twin: an extra field, a renamed class, a type changed."""
    drifted = {**DEVICE_PARAMS, "slow": SlowParams2}
    problems = faultparams.drift(drifted, STATE)
    assert any("memory has no wire field" in p for p in problems), problems
    assert any("named differently" in p for p in problems), problems

    @dataclass(frozen=True, kw_only=True)
    class CrashParams:
        wipe: str = param("yes", "text instead of a bool")

    problems = faultparams.drift(
        {**DEVICE_PARAMS, "crash": CrashParams}, device_pb2.FaultState.DESCRIPTOR
    )
    assert problems == ["crash (CrashParams / CrashParams): wipe is str but bool on the wire"]
    unknown = faultparams.drift(
        {**DEVICE_PARAMS, "meteor": CrashParams}, device_pb2.FaultState.DESCRIPTOR
    )
    assert any("no oneof field meteor" in p for p in unknown), unknown
    fewer = {k: v for k, v in DEVICE_PARAMS.items() if k != "sdc"}
    assert faultparams.drift(fewer, STATE) == ["FaultState: oneof field sdc is no kind's"]


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("crash", CrashParams(wipe=False)),
        ("slow", SlowParams(compute=0.25, link=0.5)),
        ("hbm-ecc", HbmEccParams(offset=4096, size=1 << 20)),
    ],
)
def test_a_round_trip_keeps_every_value(kind: str, params: object) -> None:
    request = fault_request(kind, params, for_s=2.0, device="n00-npu0")
    wire = device_pb2.FaultState.FromString(request.SerializeToString())
    assert faultparams.unpack(wire, DEVICE_PARAMS) == params
    assert (wire.for_s, wire.device) == (2.0, "n00-npu0")


def test_a_field_left_out_takes_the_default_and_a_kind_without_params_needs_none() -> None:
    """`optional` fields: a crash sent with nothing keeps its default wipe=True (proto3's
    implicit false would have flipped it)."""
    bare = device_pb2.FaultState(kind="crash", crash=faultparams_pb2.CrashParams())
    assert faultparams.unpack(bare, DEVICE_PARAMS) == CrashParams(wipe=True)
    assert faultparams.unpack(device_pb2.FaultState(kind="crash"), DEVICE_PARAMS) == CrashParams()
    assert faultparams.unpack(device_pb2.FaultState(kind="meteor"), DEVICE_PARAMS) is None


def test_bad_params_name_the_field() -> None:
    wrong = gateway_pb2.GatewayFault(
        kind="link-slow", switch_slow=faultparams_pb2.LinkDegradedParams(factor=0.5)
    )
    with pytest.raises(InvalidArgumentError) as err:
        faultparams.unpack(wrong, GATEWAY_PARAMS)
    assert (err.value.reason, err.value.field) == ("WRONG_FAULT_PARAMS", "switch_slow")
    far = faultparams.pack(fabric_pb2.FabricFault(kind="link-degraded"), "link-degraded",
                           LinkDegradedParams(factor=1.5))  # fmt: skip
    with pytest.raises(InvalidArgumentError) as err:
        faultparams.unpack(far, FABRIC_PARAMS)
    assert (err.value.reason, err.value.field) == ("INVALID_FAULT_PARAM", "params.factor")
    with pytest.raises(InvalidArgumentError, match="factor is required"):
        faultparams.unpack(fabric_pb2.FabricFault(kind="link-degraded"), FABRIC_PARAMS)
