"""Fault parameters over the real wire, as a user types them with the real grpcurl: each kind's
typed message in the `oneof params` of Device's FaultState, the Fabric's FabricFault and the
Gateway's GatewayFault. Another kind's oneof field is INVALID_ARGUMENT (WRONG_FAULT_PARAMS); a
value out of its range, or a required one left out, is INVALID_ARGUMENT naming the field
(`params.factor`); a field left out takes the kind's default."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import grpcurl, running_supernode

LINK = "n00-npu2.d1~n00-l1s3"
PLANE_LINK = "n00-leaf~spine1"


@pytest.fixture(scope="module")
async def sn() -> AsyncIterator[Supernode]:
    async with running_supernode("cm-minix1") as supernode:
        yield supernode


async def _call(address: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
    code, out, err = await grpcurl("-d", json.dumps(body), address, method)
    assert code == 0, err
    reply: dict[str, Any] = json.loads(out)
    return reply


async def _refused(address: str, method: str, body: dict[str, Any]) -> tuple[int, str, str]:
    """(status code, ErrorInfo reason, field) of a refused call, from grpcurl's -format-error."""
    code, out, err = await grpcurl("-format-error", "-d", json.dumps(body), address, method)
    assert code != 0 and not out, out
    status = json.loads(err)
    info = next(d for d in status.get("details", []) if d["@type"].endswith("ErrorInfo"))
    return status["code"], info["reason"], info.get("metadata", {}).get("field", "")


INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def test_a_device_fault_with_its_typed_params(sn: Supernode) -> None:
    address = sn.topology.device("n00-npu0").address
    method = "cmemu.v1.Device/InjectFault"
    stored = await _call(address, method, {"kind": "slow", "slow": {"compute": 0.5}})
    assert stored["kind"] == "slow" and stored["slow"] == {"compute": 0.5, "link": 1}
    await _call(address, "cmemu.v1.Device/ClearFault", {"kind": "slow"})
    crash = await _call(address, method, {"kind": "crash", "device": "n00-npu1"})
    assert crash["crash"] == {"wipe": True}  # left out: the default, not proto3's false
    await _call(address, "cmemu.v1.Device/ClearFault", {"kind": "crash", "device": "n00-npu1"})


@pytest.mark.parametrize(
    ("body", "reason", "field"),
    [
        ({"kind": "slow", "die_down": {"die": 1}}, "WRONG_FAULT_PARAMS", "die_down"),
        ({"kind": "slow", "slow": {"compute": 1.5}}, "INVALID_FAULT_PARAM", "params.compute"),
        ({"kind": "sdc", "sdc": {"size": 64, "mask": 256}}, "INVALID_FAULT_PARAM", "params.mask"),
        ({"kind": "die-down", "hang": {}}, "WRONG_FAULT_PARAMS", "hang"),
    ],
)
async def test_bad_device_params_are_invalid_argument_naming_the_field(
    sn: Supernode, body: dict[str, Any], reason: str, field: str
) -> None:
    address = sn.topology.device("n00-npu0").address
    got = await _refused(address, "cmemu.v1.Device/InjectFault", body)
    assert got == (INVALID, reason, field)


async def test_a_fabric_fault_with_its_typed_params(sn: Supernode) -> None:
    address = sn.topology.service(ServiceKind.FABRIC).address
    body = {"kind": "link-latency", "target": LINK, "link_latency": {"latency_us": 3}}
    stored = await _call(address, "cmemu.v1.Fabric/InjectFault", body)
    assert stored["link_latency"] == {"latency_us": 3}
    listed = await _call(address, "cmemu.v1.Fabric/ListFaults", {})
    assert [f["link_latency"] for f in listed["faults"]] == [{"latency_us": 3}]
    await _call(address, "cmemu.v1.Fabric/ClearFault", {"id": stored["id"]})


@pytest.mark.parametrize(
    ("body", "reason", "field"),
    [
        (
            {"kind": "link-degraded", "target": LINK, "link_loss": {"rate": 0.1}},
            "WRONG_FAULT_PARAMS",
            "link_loss",
        ),
        (
            {"kind": "link-degraded", "target": LINK, "link_degraded": {"factor": 1.5}},
            "INVALID_FAULT_PARAM",
            "params.factor",
        ),
        ({"kind": "link-degraded", "target": LINK}, "INVALID_FAULT_PARAM", "params.factor"),
        (
            {"kind": "link-latency", "target": LINK, "link_latency": {"latency_us": 2e6}},
            "INVALID_FAULT_PARAM",
            "params.latency_us",
        ),
        (
            {"kind": "partition", "partition": {"side_a": "n00-npu0"}},
            "INVALID_FAULT_PARAM",
            "params.side_b",
        ),
        (  # the partition's own check in the link graph names its field too
            {"kind": "partition", "partition": {"side_a": "n00-npu0", "side_b": "n00-npu0"}},
            "INVALID_ARGUMENT",
            "params.side_a",
        ),
        ({"kind": "optical-module", "target": LINK}, "MALFORMED_ID", "target"),  # else the target
    ],
)
async def test_bad_fabric_params_are_invalid_argument_naming_the_field(
    sn: Supernode, body: dict[str, Any], reason: str, field: str
) -> None:
    address = sn.topology.service(ServiceKind.FABRIC).address
    got = await _refused(address, "cmemu.v1.Fabric/InjectFault", body)
    assert got == (INVALID, reason, field)


async def test_a_gateway_fault_with_its_typed_params(sn: Supernode) -> None:
    address = sn.topology.service(ServiceKind.GATEWAY).address
    body = {"kind": "link-slow", "target": PLANE_LINK, "link_slow": {"factor": 0.5}}
    stored = await _call(address, "cmemu.v1.Gateway/InjectFault", body)
    assert stored["link_slow"] == {"factor": 0.5}
    await _call(address, "cmemu.v1.Gateway/ClearFault", {"id": stored["id"]})


@pytest.mark.parametrize(
    ("body", "reason", "field"),
    [
        (
            {"kind": "link-slow", "target": PLANE_LINK, "switch_slow": {"factor": 0.5}},
            "WRONG_FAULT_PARAMS",
            "switch_slow",
        ),
        (
            {"kind": "link-slow", "target": PLANE_LINK, "link_slow": {"factor": 2}},
            "INVALID_FAULT_PARAM",
            "params.factor",
        ),
    ],
)
async def test_bad_gateway_params_are_invalid_argument_naming_the_field(
    sn: Supernode, body: dict[str, Any], reason: str, field: str
) -> None:
    address = sn.topology.service(ServiceKind.GATEWAY).address
    got = await _refused(address, "cmemu.v1.Gateway/InjectFault", body)
    assert got == (INVALID, reason, field)
