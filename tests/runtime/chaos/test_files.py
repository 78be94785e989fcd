"""Scenario files: the JSON Schema, the library, and bad files named by their YAML path."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from cmemu.emulator.client.faults import KINDS
from cmemu.emulator.engines.device.kinds.clock_skew import ClockSkewParams
from cmemu.emulator.engines.device.kinds.crash import CrashParams
from cmemu.emulator.model.chaos.scenario import parse_scenario
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.runtime.chaos import files

LIBRARY = files.library()


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(files.schema())
    assert json.loads(files.SCHEMA_FILE.read_text())["properties"]["version"] == {"const": 1}


@pytest.mark.parametrize("path", LIBRARY, ids=[p.stem for p in LIBRARY])
def test_every_library_scenario_meets_the_schema(path: Path) -> None:
    files.validate(yaml.safe_load(path.read_text()))


def test_every_kind_the_library_uses_is_registered() -> None:
    used = {
        step["fault"]
        for path in LIBRARY
        for step in yaml.safe_load(path.read_text()).get("steps", [])
    }
    assert used <= set(KINDS), sorted(used - set(KINDS))


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"version": 1, "name": "x", "steps": [{"at": "3 weeks", "fault": "f",
                                                "target": {"none": ""}}]}, "steps[0].at"),
        ({"version": 1, "name": "x", "expect": {"slo": {}}}, "expect.slo"),
        ({"version": 1, "name": "x", "steps": [{"at": 1, "fault": "f",
                                                "target": {"npu": "a", "die": "b"}}]},
         "steps[0].target"),
        ({"version": 1, "name": "x", "workloads": {"ems": {"objects": 0, "size": 1}}},
         "workloads.ems.objects"),
        ({"version": 1, "name": "x", "time_scale": 0}, "time_scale"),
        ({"version": 1, "name": "x", "abort": {}}, "abort"),
        ({"version": 1, "name": "x", "time_scale": "fast"}, "time_scale"),
    ],
)  # fmt: skip
def test_the_schema_names_the_yaml_path_of_a_bad_field(doc: object, path: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        files.validate(doc)
    assert caught.value.field == path, str(caught.value)


def test_a_scenario_s_pace_is_a_positive_time_scale_or_the_emulator_s() -> None:
    assert parse_scenario({"version": 1, "name": "x", "time_scale": 5}).time_scale == 5.0
    assert parse_scenario({"version": 1, "name": "x"}).time_scale is None
    for bad in (0, -1, float("inf"), True, "5"):
        with pytest.raises(InvalidArgumentError) as caught:
            parse_scenario({"version": 1, "name": "x", "time_scale": bad})
        assert caught.value.field == "time_scale", bad


def test_a_scenario_file_is_read_with_its_deployment_files(tmp_path: Path) -> None:
    deployments = Path(__file__).resolve().parents[3] / "examples" / "deployments"
    (tmp_path / "s.yaml").write_text(
        "version: 1\nname: s\nworkloads:\n  serving:\n"
        f"    - {{name: chat, deployment: {deployments / 'small.yaml'}}}\n"
        "steps:\n  - {at: 1s, fault: link-degraded, target: {link: random}, "
        "params: {factor: 0.5}}\n"
    )
    scenario = files.load(tmp_path / "s.yaml")
    assert scenario.workloads.serving[0].spec["decode"]["npus"] == 8
    assert scenario.steps[0].typed_params is not None


def test_bad_files_are_refused_with_the_path(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        files.load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("version: 1\nname: [unclosed\n")
    with pytest.raises(InvalidArgumentError, match="not YAML"):
        files.load(tmp_path / "bad.yaml")
    (tmp_path / "kind.yaml").write_text(
        "version: 1\nname: k\nsteps:\n  - {at: 1s, fault: meteor, target: {none: ''}}\n"
    )
    with pytest.raises(InvalidArgumentError) as caught:
        files.load(tmp_path / "kind.yaml")
    assert caught.value.field == "steps[0].fault"
    (tmp_path / "ref.yaml").write_text(
        "version: 1\nname: r\nworkloads:\n  serving: [{name: c, deployment: nowhere.yaml}]\n"
    )
    with pytest.raises(NotFoundError, match=r"nowhere\.yaml"):
        files.load(tmp_path / "ref.yaml")
    with pytest.raises(NotFoundError, match="library"):
        files.find("no-such-scenario")
    assert files.find("l2-plane-loss").name == "l2-plane-loss.yaml"


def test_the_faults_real_supernodes_have_are_scenario_steps(tmp_path: Path) -> None:
    (tmp_path / "real.yaml").write_text(
        "version: 1\nname: real\nsteps:\n"
        "  - {at: 1s, fault: thermal-throttle, target: {node: n01}, params: {compute: 0.7}}\n"
        "  - {at: 2s, fault: link-loss, target: {link: random}, params: {rate: 0.01}}\n"
        "  - {at: 3s, fault: intermittent-hang, target: {npu: random},"
        " params: {period_s: 60, hang_s: 5}, duration: 5m}\n"
        "  - {at: 4s, fault: optical-module, target: {switch: n00-l1s3}, params: {module: 1}}\n"
        "  - {at: 5s, fault: rack-power-off, target: {rack: rack00}, params: {wipe: false},"
        " duration: 1m}\n"
        "  - {at: 6s, fault: sdc, target: {mempool: n01-mem}, params: {size: 64, mask: 3}}\n"
        "  - {at: 7s, fault: ssd-loss, target: {service: ems}}\n"
        "  - {at: 8s, fault: supernode-partition, target: {link: sn0~sn1}}\n"
        "  - {at: 9s, fault: checkpoint-corrupt, target: {job: pretrain}}\n"
        "  - {at: 10s, fault: l1-board, target: {node: n01}}\n"
        "  - {at: 11s, fault: clock-skew, target: {npu: random}, params: {offset_s: -30},"
        " duration: 2m}\n"
    )
    steps = files.load(tmp_path / "real.yaml").steps
    assert [type(s.typed_params).__name__ for s in steps] == [
        "ThermalThrottleParams", "LinkLossParams", "IntermittentHangParams", "OpticalModuleParams",
        "CrashParams", "SdcParams", "NoParams", "NoParams", "NoParams", "NoParams",
        "ClockSkewParams",
    ]  # fmt: skip
    assert steps[10].typed_params == ClockSkewParams(offset_s=-30.0)
    assert steps[9].target.what == "node"
    assert steps[4].target.what == "rack" and steps[4].typed_params == CrashParams(wipe=False)
    (tmp_path / "bad.yaml").write_text(
        "version: 1\nname: bad\nsteps:\n"
        "  - {at: 1s, fault: link-loss, target: {link: random}, params: {rate: 1.5}}\n"
    )
    with pytest.raises(InvalidArgumentError, match=r"rate must be in \(0, 1\)"):
        files.load(tmp_path / "bad.yaml")
    (tmp_path / "skew.yaml").write_text(
        "version: 1\nname: skew\nsteps:\n"
        "  - {at: 1s, fault: clock-skew, target: {npu: random}, params: {drift_ppm: 1e6}}\n"
    )
    with pytest.raises(InvalidArgumentError, match="drift_ppm must be within"):
        files.load(tmp_path / "skew.yaml")
    (tmp_path / "rack.yaml").write_text(
        "version: 1\nname: rack\nsteps:\n  - {at: 1s, fault: rack-power-off, target: {rack: r3}}\n"
    )
    with pytest.raises(InvalidArgumentError, match="not a valid rack id"):
        files.load(tmp_path / "rack.yaml")
