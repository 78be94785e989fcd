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

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.chaos.pace import ABORTED
from cmemu.emulator.pytest_plugin import start_supernode
from cmemu.emulator.runtime.chaos import files
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario

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
    # a run the host did not let keep pace (ABORTED: the lag guard) judged nothing: it is run
    # again on a fresh supernode, up to three times in all, as the engine test does
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        sn = start_supernode(
            preset="cm-mini", mode="inprocess", time_scale=TIME_SCALE,
            directory=tmp_path / str(attempt), broker=True,
        )  # fmt: skip
        try:

            async def run(clients: Clients) -> RunResult:
                return await run_scenario(clients, scenario, RunOptions(warm=True))

            result = sn.call(run)
        finally:
            sn.stop()
        if result.outcome != ABORTED:
            break
    assert result.ok, _why(result)
    assert result.observations.injections, "a scenario that injects nothing proves nothing"


def _why(result: RunResult) -> str:
    """The verdict, and what the run saw: a failure seen once in CI must say enough to be
    understood from its output alone."""
    obs = result.observations
    return "\n".join([
        *summary_lines(result),
        "injections:", *map(repr, obs.injections),
        "incidents:", *map(repr, obs.incidents),
        "workload events (the last 40):", *map(repr, obs.events[-40:]),
        "notes:", *obs.notes,
    ])  # fmt: skip


def test_every_shipped_scenario_is_run_somewhere() -> None:
    """The list above leaves out only what other tests run: a new file is not silently skipped."""
    names = {p.name for p in SCENARIOS.glob("*.yaml")}
    elsewhere = {n for n in names if n.startswith(ELSEWHERE)}
    assert elsewhere == {
        "container-storm.yaml", "container-storm-must-fail.yaml", "mixed-storm.yaml",
        "npu-crash-decode.yaml",
    }  # fmt: skip
    assert {p.name for p in _shipped()} == names - elsewhere
