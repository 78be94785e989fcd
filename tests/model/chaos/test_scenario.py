"""The scenario parser, the selectors and the schedule: golden files of the library, and every
kind of bad input named by its YAML path."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from cmemu.emulator.model.chaos.scenario import Scenario, deployment_refs, parse_scenario
from cmemu.emulator.model.chaos.schedule import horizon_s, plan
from cmemu.emulator.model.chaos.selectors import Placement, parse_selector, resolve
from cmemu.emulator.model.chaos.units import count_or_rate, duration_s, format_s, size_bytes
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.topology import build

ROOT = Path(__file__).resolve().parents[3]
LIBRARY = sorted((ROOT / "scenarios").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden" / "chaos"
SMALL = yaml.safe_load((ROOT / "examples" / "deployments" / "small.yaml").read_text())


def _parse_file(path: Path) -> Scenario:
    doc = yaml.safe_load(path.read_text())
    documents = {
        ref: yaml.safe_load((path.parent / ref).read_text()) for ref in deployment_refs(doc)
    }
    return parse_scenario(doc, documents=documents)


def _golden_doc(s: Scenario) -> dict[str, Any]:
    planned = plan(s, random.Random(s.seed))
    return {
        "scenario": dataclasses.asdict(s),
        "schedule": [
            {"step": p.label, "at_s": round(p.at_s, 6),
             "clear_at_s": None if p.clear_at_s is None else round(p.clear_at_s, 6)}
            for p in planned
        ],
        "horizon_s": round(horizon_s(s, planned, 600.0), 6),
    }  # fmt: skip


@pytest.mark.parametrize("path", LIBRARY, ids=[p.stem for p in LIBRARY])
def test_library_scenario_parses_to_its_golden_file(path: Path) -> None:
    """Every scenario of scenarios/ parses, and to exactly what it did when its golden file was
    written: a change of the format or the parser shows up here. Regenerate with
    CMEMU_UPDATE_GOLDEN=1 after checking the diff."""
    got = json.loads(json.dumps(_golden_doc(_parse_file(path)), sort_keys=True, default=str))
    golden = GOLDEN / f"{path.stem}.json"
    if os.environ.get("CMEMU_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(golden.read_text())


def test_the_library_has_the_scenarios_the_issue_asks_for() -> None:
    names = {p.stem for p in LIBRARY}
    assert {
        "npu-crash-decode", "node-power-off-training", "l2-plane-loss", "mempool-loss",
        "broker-outage", "flapping-link", "mixed-storm",
    } <= names  # fmt: skip


MINIMAL = {"version": 1, "name": "t", "steps": []}
STEP = {"at": "30s", "fault": "device-down", "target": {"npu": "n00-npu0"}}


def _with(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(MINIMAL))
    doc.update(changes)
    return doc


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("no version", {"name": "t"}, "(top)"),
    ("version 2", _with(version=2), "version"),
    ("unknown top field", _with(stepz=[]), "stepz"),
    ("bad name", _with(name="Not A Label"), "name"),
    ("bad at", _with(steps=[{**STEP, "at": "30 parsecs"}]), "steps[0].at"),
    ("negative at", _with(steps=[{**STEP, "at": -1}]), "steps[0].at"),
    ("at and after", _with(steps=[{**STEP, "after": "x"}]), "steps[0]"),
    ("neither at nor after", _with(steps=[{"fault": "crash", "target": {"npu": "random"}}]),
     "steps[0]"),
    ("after nothing", _with(steps=[{"after": "ghost", "fault": "x", "target": {"npu": "random"}}]),
     "steps[0].after"),
    ("loop", _with(steps=[
        {"id": "a", "after": "b", "fault": "x", "target": {"none": ""}},
        {"id": "b", "after": "a", "fault": "x", "target": {"none": ""}}]), "steps[0].after"),
    ("delay without after", _with(steps=[{**STEP, "delay": "1s"}]), "steps[0].delay"),
    ("unknown step field", _with(steps=[{**STEP, "colour": "red"}]), "steps[0].colour"),
    ("two step ids", _with(steps=[{**STEP, "id": "a"}, {**STEP, "id": "a"}]), "steps"),
    ("target two keys", _with(steps=[{**STEP, "target": {"npu": "random", "node": "n00"}}]),
     "steps[0].target"),
    ("target unknown", _with(steps=[{**STEP, "target": {"gpu": "random"}}]), "steps[0].target"),
    ("target bad id", _with(steps=[{**STEP, "target": {"npu": "n0-gpu"}}]), "steps[0].target.npu"),
    ("target bad random", _with(steps=[{**STEP, "target": {"npu": "random of x"}}]),
     "steps[0].target.npu"),
    ("target bad group", _with(steps=[{**STEP, "target": {"npu": "random in rack r1"}}]),
     "steps[0].target.npu"),
    ("role on a job", _with(steps=[{**STEP, "target": {"npu": "random in job j decode"}}]),
     "steps[0].target.npu"),
    ("undeclared deployment", _with(steps=[{**STEP, "target": {"npu": "random in deployment d"}}]),
     "steps[0].target.npu"),
    ("repeat count 0", _with(steps=[{**STEP, "repeat": {"count": 0, "every": "1m"}}]),
     "steps[0].repeat.count"),
    ("repeat every 0", _with(steps=[{**STEP, "repeat": {"count": 2, "every": 0}}]),
     "steps[0].repeat.every"),
    ("duration 0", _with(steps=[{**STEP, "duration": "0s"}]), "steps[0].duration"),
    ("jitter text", _with(steps=[{**STEP, "jitter": "soon"}]), "steps[0].jitter"),
    ("recovered_within bad", _with(expect={"recovered_within": "ten minutes"}),
     "expect.recovered_within"),
    ("failed_requests rate > 1", _with(expect={"failed_requests": "150%"}),
     "expect.failed_requests"),
    ("failed_requests negative", _with(expect={"failed_requests": -1}), "expect.failed_requests"),
    ("lost_objects without ems", _with(expect={"lost_objects": 0}), "expect.lost_objects"),
    ("slo without load", _with(expect={"slo": {"tpot_ms": 50}}), "expect.slo"),
    ("slo unknown", _with(expect={"slo": {"tpop_ms": 50}}), "expect.slo.tpop_ms"),
    ("training_progress without job", _with(expect={"training_progress": {}}),
     "expect.training_progress"),
    ("goodput > 1", _with(workloads={"training": [{"name": "j", "npus": 1}]},
                          expect={"training_progress": {"min_goodput": 2}}),
     "expect.training_progress.min_goodput"),
    ("serving without spec", _with(workloads={"serving": [{"name": "d"}]}),
     "workloads.serving[0]"),
    ("serving file not loaded",
     _with(workloads={"serving": [{"name": "d", "deployment": "x.yaml"}]}),
     "workloads.serving[0].deployment"),
    ("training npus 0", _with(workloads={"training": [{"name": "j", "npus": 0}]}),
     "workloads.training[0].npus"),
    ("training unknown field", _with(workloads={"training": [{"name": "j", "npus": 1, "gpus": 2}]}),
     "workloads.training[0].gpus"),
    ("two workloads one name", _with(workloads={"training": [{"name": "j", "npus": 1}],
                                                "serving": [{"name": "j", "spec": SMALL}]}),
     "workloads"),
    ("ems size", _with(workloads={"ems": {"objects": 1, "size": "lots"}}), "workloads.ems.size"),
    ("ems kind", _with(workloads={"ems": {"objects": 1, "size": 1, "kind": "video"}}),
     "workloads.ems.kind"),
    ("load output 1", _with(workloads={"serving": [{"name": "d", "spec": SMALL,
                                                    "load": {"output_tokens": 1}}]}),
     "workloads.serving[0].load.output_tokens"),
    ("not a mapping", [], "(top)"),  # type: ignore[list-item]
]  # fmt: skip


@pytest.mark.parametrize(("doc", "path"), [(d, p) for _, d, p in BAD], ids=[n for n, _, _ in BAD])
def test_a_bad_scenario_is_refused_naming_the_yaml_path(doc: Any, path: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_scenario(doc)
    assert caught.value.field == path, str(caught.value)
    assert str(caught.value).startswith(f"{path}: ")


def test_fault_params_are_checked_by_the_kind_and_named_by_path() -> None:
    def params_from(raw: Any) -> dict[str, Any]:
        if set(raw) - {"factor"}:
            raise InvalidArgumentError("unknown parameter", field=sorted(set(raw) - {"factor"})[0])
        return dict(raw)

    kinds = {"link-degraded": params_from}
    step = {"at": 1, "fault": "link-degraded", "target": {"link": "random"}}
    good = parse_scenario(_with(steps=[{**step, "params": {"factor": 0.5}}]), kinds=kinds)
    assert good.steps[0].typed_params == {"factor": 0.5}
    with pytest.raises(InvalidArgumentError) as caught:
        parse_scenario(_with(steps=[{**step, "params": {"speed": 2}}]), kinds=kinds)
    assert caught.value.field == "steps[0].params.speed"
    with pytest.raises(InvalidArgumentError) as caught:
        parse_scenario(_with(steps=[{**step, "fault": "meteor"}]), kinds=kinds)
    assert caught.value.field == "steps[0].fault"
    assert "link-degraded" in str(caught.value)


def test_units() -> None:
    assert duration_s("30s", "x") == 30
    assert duration_s("10m", "x") == 600
    assert duration_s("1.5h", "x") == 5400
    assert duration_s("500ms", "x") == 0.5
    assert duration_s("2d", "x") == 172800
    assert duration_s(12, "x") == 12
    assert duration_s("1m30s", "x") == 90 and duration_s("1h 30m", "x") == 5400
    assert duration_s("2min", "x") == 120 and duration_s("800us", "x") == pytest.approx(800e-6)
    for bad in (True, "1 fortnight", "-3s", None, [1], "1m30", "m", ""):
        with pytest.raises(InvalidArgumentError):
            duration_s(bad, "x")
    assert size_bytes("64KiB", "x") == 65536
    assert size_bytes("1MB", "x") == 10**6
    assert size_bytes(4096, "x") == 4096
    assert count_or_rate(0, "x") == (0, None)
    assert count_or_rate("1%", "x") == (None, 0.01)
    assert count_or_rate({"rate": 0.5}, "x") == (None, 0.5)
    assert format_s(42.0) == "42.0s" and format_s(192) == "3m12s" and format_s(3720) == "1h02m"


def test_schedule_repeats_with_seeded_jitter_and_waits_for_after() -> None:
    doc = _with(
        steps=[
            {"id": "a", "at": "1m", "fault": "x", "target": {"none": ""}, "duration": "30s",
             "repeat": {"count": 3, "every": "2m"}, "jitter": "10s"},
            {"id": "b", "after": "a", "delay": "15s", "fault": "y", "target": {"none": ""}},
        ]
    )  # fmt: skip
    s = parse_scenario(doc)
    first = plan(s, random.Random(1))
    assert plan(s, random.Random(1)) == first  # the seed replays it
    assert plan(s, random.Random(2)) != first
    a = [p for p in first if p.step.id == "a"]
    b = next(p for p in first if p.step.id == "b")
    assert [p.label for p in a] == ["a", "a#2", "a#3"]
    for n, p in enumerate(a):
        assert 60 + 120 * n <= p.at_s <= 60 + 120 * n + 10 + (10 if n else 0)
        assert p.clear_at_s == pytest.approx(p.at_s + 30)
    assert b.at_s == pytest.approx(a[0].at_s + 15)
    assert [p.at_s for p in first] == sorted(p.at_s for p in first)
    assert horizon_s(s, first, 600) == pytest.approx(
        max(p.clear_at_s or p.at_s for p in first) + 600
    )


def test_selectors_resolve_within_their_group_and_replay_with_the_seed() -> None:
    topo = build("cm-mini")
    placement = Placement(
        deployments={"chat": {"decode": ["n00-npu0", "n00-npu1"], "prefill": ["n01-npu4"]}},
        jobs={"pretrain": ["n01-npu0", "n01-npu1"]},
    )

    def pick(raw: dict[str, Any], seed: int = 0) -> list[str]:
        return resolve(parse_selector(raw, "t"), topo, placement, random.Random(seed))

    assert pick({"npu": "n00-npu3"}) == ["n00-npu3"]
    for seed in range(10):
        assert pick({"npu": "random in deployment chat decode"}, seed)[0] in {
            "n00-npu0",
            "n00-npu1",
        }
        assert pick({"npu": "random in deployment chat"}, seed)[0] in {
            "n00-npu0", "n00-npu1", "n01-npu4"}  # fmt: skip
        assert pick({"die": "random in job pretrain"}, seed)[0].split(".")[0] in {
            "n01-npu0", "n01-npu1"}  # fmt: skip
        assert pick({"node": "random in job pretrain"}, seed) == ["n01"]
        assert pick({"mempool": "random in job pretrain"}, seed) == ["n01-mem"]
        link = pick({"link": "random in node n01"}, seed)[0]
        assert "n01" in link
    assert pick({"npu": "random 2 in job pretrain"}) == pick({"npu": "random 2 in job pretrain"})
    assert sorted(pick({"npu": "random 2 in job pretrain"})) == ["n01-npu0", "n01-npu1"]
    plane = pick({"plane": 3})
    assert plane and all(s.startswith("l2-p3-") for s in plane)
    assert pick({"none": ""}) == [""]
    with pytest.raises(InvalidArgumentError, match="3 wanted"):
        pick({"npu": "random 3 in job pretrain"})
    with pytest.raises(InvalidArgumentError, match="no deployment"):
        pick({"npu": "random in deployment other"})
    with pytest.raises(InvalidArgumentError, match="no 'train' role"):
        pick({"npu": "random in deployment chat train"})
