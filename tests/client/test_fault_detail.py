"""`cmemu fault ls`'s detail of a fabric fault, as each kind's module describes its params
(emulator/model/faults/fabric/ Kind.describe), for every fabric kind."""

from __future__ import annotations

from typing import Any

import pytest

from cmemu.emulator.client.faultkinds.fabric import fabric_detail
from cmemu.emulator.client.wire import faultparams
from cmemu.emulator.model.faults import fabric
from cmemu.v1 import fabric_pb2

SIDES = {"side_a": "n00-npu0,n00-npu1", "side_b": "n01-npu0"}
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("link-degraded", {"factor": 0.25}, "factor=0.25"),
    ("ports-degraded", {"factor": 0.5}, "factor=0.5"),
    ("rank-slow", {"factor": 0.3}, "factor=0.3"),
    ("link-latency", {"latency_us": 12.5}, "latency=+12.5us"),
    ("link-loss", {"rate": 0.01}, "rate=0.01"),
    ("optical-module", {"module": 0}, "module=0"),
    ("link-flap", {}, "period=10s duty=0.5"),
    ("link-flap", {"period_s": 2.0, "duty": 0.25}, "period=2s duty=0.25"),
    ("partition", SIDES, "side_a=n00-npu0,n00-npu1 side_b=n01-npu0"),
    (
        "partition",
        {**SIDES, "one_way": True},
        "side_a=n00-npu0,n00-npu1 side_b=n01-npu0 one-way (side_a to side_b lost)",
    ),
    ("link-down", {}, ""),
    ("switch-down", {}, ""),
    ("rank-down", {}, ""),
    ("rank-hung", {}, ""),
    ("l1-board", {}, ""),
]


def _listed(kind: str, params: dict[str, Any], until_ns: int = 0) -> fabric_pb2.FabricFault:
    typed = fabric.PARAMS[kind](**params)
    fault = fabric_pb2.FabricFault(kind=kind, target="x", until_ns=until_ns)
    return faultparams.pack(fault, kind, typed)


def test_every_fabric_kind_is_described() -> None:
    assert {kind for kind, _, _ in CASES} == set(fabric.KINDS)


@pytest.mark.parametrize(("kind", "params", "text"), CASES)
def test_a_kind_describes_its_params_and_when_it_ends(
    kind: str, params: dict[str, Any], text: str
) -> None:
    assert fabric_detail(_listed(kind, params)) == text
    ending = fabric_detail(_listed(kind, params, until_ns=12_345_000_000))
    assert ending == f"{text} until=12.345s".strip()
