"""A scenario run on a fresh in-process supernode, as the chaos tests run one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.chaos.pace import ABORTED
from cmemu.emulator.model.chaos.scenario import Scenario
from cmemu.emulator.pytest_plugin import start_supernode
from cmemu.emulator.runtime.chaos.run import RunOptions, RunResult
from cmemu.emulator.runtime.chaos.runner import run_scenario

ATTEMPTS = 3


def run_fresh(
    scenario: Scenario, directory: Path, *, time_scale: float, preset: str = "cm-mini"
) -> RunResult:
    """`scenario` (deployments warm) on a fresh in-process `preset`. A run the host did not
    let keep pace (ABORTED: the lag guard) judged nothing: it is run again on a fresh
    supernode, up to ATTEMPTS times in all, as the engine test does."""
    for attempt in range(ATTEMPTS):
        (directory / str(attempt)).mkdir()
        sn = start_supernode(
            preset=preset, mode="inprocess", time_scale=time_scale,
            directory=directory / str(attempt), broker=True,
        )  # fmt: skip
        try:

            async def run(clients: Clients) -> RunResult:
                return await run_scenario(clients, scenario, RunOptions(warm=True))

            result = sn.call(run)
        finally:
            sn.stop()
        if result.outcome != ABORTED:
            break
    return result


def judged(run: Callable[[], RunResult]) -> RunResult:
    """The verdict of `run` (a scenario run on a shared emulator): a run the host did not let
    keep pace (ABORTED: the lag guard, on a host loaded past what the clock's dilation absorbs)
    judged nothing, and is run again, up to ATTEMPTS times in all, as run_fresh does."""
    for _ in range(ATTEMPTS):
        result = run()
        if result.outcome != ABORTED:
            break
    return result


def why(result: RunResult) -> str:
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
