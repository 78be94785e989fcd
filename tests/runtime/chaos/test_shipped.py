"""Every scenario shipped in scenarios/ passes end to end (issue 20): each on a fresh in-process
supernode of its preset (a scenario's faults can leave failed NPUs held back, which would change
the next one's placement), beside the MQTT broker its faults may take down. Deployments start
warm (their weights staged in EMS: an 80 emulated s load, not 640 cold): no scenario judges its
set-up, and a fresh emulator would otherwise wait out a cold load every run. The container
scenarios run through the Docker engine in tests/runtime/test_docker_engine.py; cm384's
mixed-storm in bench/chaos.py; npu-crash-decode in test_runner.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmemu.emulator.runtime.chaos import files
from tests.runtime.chaos.fresh import run_fresh, why

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
TIME_SCALE = 50.0  # dilation keeps a verdict the same at any scale; the pace guard says if not
# the engine test's; the cm384 benchmark's; test_runner.py's (through the plugin, with its phases)
ELSEWHERE = ("container-", "mixed-storm", "npu-crash-decode")


def _shipped() -> list[Path]:
    return sorted(p for p in SCENARIOS.glob("*.yaml") if not p.name.startswith(ELSEWHERE))


@pytest.mark.slow
@pytest.mark.parametrize("path", _shipped(), ids=lambda p: p.stem)
def test_a_shipped_scenario_passes(path: Path, tmp_path: Path) -> None:
    scenario = files.load(path)
    assert scenario.preset == "cm-mini"
    result = run_fresh(scenario, tmp_path, time_scale=TIME_SCALE)
    assert result.ok, why(result)
    assert result.observations.injections, "a scenario that injects nothing proves nothing"


def test_every_shipped_scenario_is_run_somewhere() -> None:
    """The list above leaves out only what other tests run: a new file is not silently skipped."""
    names = {p.name for p in SCENARIOS.glob("*.yaml")}
    elsewhere = {n for n in names if n.startswith(ELSEWHERE)}
    assert elsewhere == {
        "container-storm.yaml", "container-storm-must-fail.yaml", "mixed-storm.yaml",
        "npu-crash-decode.yaml",
    }  # fmt: skip
    assert {p.name for p in _shipped()} == names - elsewhere
