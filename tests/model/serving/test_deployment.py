"""Deployments as data: the examples parse, bad fields are refused by name, and instances are
laid on the platform's NPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.serving.deployment import instance_dies, layout, parse_deployment
from cmemu.emulator.model.topology import DeviceKind, build

ROOT = Path(__file__).resolve().parents[3]


def _load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples/deployments" / name).read_text())
    return doc


def test_the_published_layout() -> None:
    d = parse_deployment(_load("deepseek-r1.yaml"))
    assert d.decode_ep() == 320 and d.decode_dies() == 320
    assert d.prefill_ep() == 32 and d.prefill.instances == 6
    assert d.npus == 160 + 96
    npus = [x.id for x in build("cm384").devices if x.kind is DeviceKind.NPU]
    placed = layout(d, npus)
    assert list(placed) == ["decode-0"] + [f"prefill-{i}" for i in range(6)]
    assert placed["decode-0"][0] == "n00-npu0" and len(placed["decode-0"]) == 160
    assert placed["prefill-0"][0] == "n20-npu0"
    assert instance_dies(placed["prefill-0"][:1]) == ("n20-npu0.d0", "n20-npu0.d1")


def test_the_small_deployment_fits_cm_mini() -> None:
    d = parse_deployment(_load("small.yaml"))
    npus = [x.id for x in build(d.preset).devices if x.kind is DeviceKind.NPU]
    assert d.npus <= len(npus) == 16
    layout(d, npus)
    with pytest.raises(InvalidArgumentError, match="needs 256 NPUs"):
        layout(parse_deployment(_load("deepseek-r1.yaml")), npus)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"version": 3}, "version"),
        ({"decoder": {}}, None),
        ({"platform": "dgx"}, "platform"),
        ({"model": "llama"}, "model"),
        ({"router": "random"}, "router"),
        ({"placement": "magic"}, "placement"),
        ({"decode": {"npus": 0}}, "decode.npus"),
        ({"decode": {"npus": "many"}}, "decode.npus"),
        ({"decode": {"ep": 1000}}, "decode.ep"),
        ({"decode": {"mtp": "yes"}}, "decode.mtp"),
        ({"decode": {"microbatches": 3}}, "decode.microbatches"),
        ({"decode": {"speed": 3}}, "decode"),
        ({"decode": []}, "decode"),
        ({"prefill": {"batch_tokens": -1}}, "prefill.batch_tokens"),
        ({"ems": {"capacity_bytes": -5}}, "ems.capacity_bytes"),
        ({"decode": {"tpot_target_s": 0}}, "decode.tpot_target_s"),
    ],
)
def test_bad_fields_are_named(doc: dict, field: str | None) -> None:  # type: ignore[type-arg]
    with pytest.raises((InvalidArgumentError, NotFoundError)) as info:
        parse_deployment(doc)
    assert info.value.field == field


def test_numbers_widen_to_floats_but_bools_stay_apart() -> None:
    d = parse_deployment({"decode": {"tpot_target_s": 1}})
    assert d.decode.tpot_target_s == 1.0
    with pytest.raises(InvalidArgumentError):
        parse_deployment({"decode": {"npus": True}})
