"""The chaos runner end to end against a real emulator (`cmemu up`, started by the cmemu pytest
plugin's `supernode` fixture): workloads started through the public APIs, faults injected on the
emulated schedule, the verdict judged from the manager's incidents and the workloads' status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.model.errors import NotFoundError
from cmemu.emulator.pytest_plugin import Chaos, RunningSupernode, WaitFor
from tests.runtime.chaos.fresh import judged

pytestmark = pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=20)

LINKS_AND_OBJECTS = """
version: 1
name: links-and-objects
seed: 9
workloads:
  ems: {objects: 8, size: 4KiB, prefix: test/links/}
steps:
  - {id: cut, at: 10s, fault: link-down, target: {link: random in node n01}, duration: 20s}
  - {after: cut, delay: 5s, fault: switch-down, target: {switch: random in node n00},
     duration: 10s, repeat: {count: 2, every: 15s}}
expect:
  recovered_within: 10m
  lost_objects: 0
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_faults_go_in_and_out_on_the_emulated_schedule(chaos: Chaos, tmp_path: Path) -> None:
    result = judged(lambda: chaos.run(_write(tmp_path, LINKS_AND_OBJECTS)))
    assert result.ok, "\n".join(summary_lines(result))
    assert len([e for e in result.timeline if e.phase == "fault"]) == 3
    assert len([e for e in result.timeline if e.phase == "cleared"]) == 3
    by_label = {i.label: i for i in result.observations.injections}
    assert sorted(by_label) == ["cut", "step-2", "step-2#2"]
    start = result.observations.start_ns
    # the schedule: 10 s; 5 s after the first; 15 s after that (no jitter), never early
    assert by_label["cut"].planned_ns - start == 10e9
    assert by_label["step-2"].planned_ns - start == 15e9
    assert by_label["step-2#2"].planned_ns - start == 30e9
    for i in result.observations.injections:
        assert i.at_ns >= i.planned_ns
        assert i.cleared_ns is not None and i.cleared_ns > i.at_ns
    assert result.observations.lost_objects == 0
    assert {c.name for c in result.verdict.checks} == {
        "faults_injected", "recovered_within", "lost_objects"}  # fmt: skip


# the same random selectors as above, a few emulated seconds long: only the picks are compared
SEEDED = """
version: 1
name: seeded
seed: 9
duration: 20s
steps:
  - {id: cut, at: 1s, fault: link-down, target: {link: random in node n01}, duration: 1s}
  - {after: cut, delay: 1s, fault: switch-down, target: {switch: random in node n00},
     duration: 1s, repeat: {count: 2, every: 2s}}
expect:
  recovered_within: 1m
"""


def test_the_same_seed_picks_the_same_targets(chaos: Chaos, tmp_path: Path) -> None:
    path = _write(tmp_path, SEEDED)
    first = chaos.run(path, seed=3)
    again = chaos.run(path, seed=3)
    other = chaos.run(path, seed=4)
    targets = [[i.target for i in r.observations.injections] for r in (first, again, other)]
    assert targets[0] == targets[1]
    assert targets[0] != targets[2]


def test_a_fault_that_cannot_go_in_fails_the_run(chaos: Chaos, tmp_path: Path) -> None:
    text = LINKS_AND_OBJECTS.replace("{link: random in node n01}", "{npu: n09-npu0}").replace(
        "link-down", "device-down"
    )
    result = judged(lambda: chaos.run(_write(tmp_path, text)))
    assert not result.ok
    check = next(c for c in result.verdict.checks if c.name == "faults_injected")
    assert not check.ok and "NOT_FOUND" in check.detail


def test_the_plugin_injects_and_waits_in_emulated_time(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor
) -> None:
    fault = chaos.inject("device-down", "n01-npu2", {"reason": "plugin test"})
    took = wait_for(
        lambda: supernode.call(lambda c: c.health("n01-npu2")) == "NOT_SERVING",
        within_emulated_s=60,
    )
    assert 0 <= took <= 60
    chaos.clear(fault.id)
    wait_for(lambda: supernode.call(lambda c: c.health("n01-npu2")) == "SERVING", 60)
    with pytest.raises(pytest.fail.Exception, match="within 1 emulated s"):
        wait_for(lambda: False, within_emulated_s=1)


def test_a_crashed_device_s_health_is_unreachable_not_an_exception(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor
) -> None:
    """Issue 21, finding 19: `c.health()` of a crashed device answers UNREACHABLE (a check of
    health is asked to find exactly that); an unknown service name still raises NOT_FOUND."""
    fault = chaos.inject("crash", "n01-npu4")
    wait_for(lambda: supernode.call(lambda c: c.health("n01-npu4")) == "UNREACHABLE", 60)
    chaos.clear(fault.id)
    wait_for(lambda: supernode.call(lambda c: c.health("n01-npu4")) == "SERVING", 60)
    with pytest.raises(NotFoundError):  # the typed client's one error type
        supernode.call(lambda c: c.health("n01-npu4", "cmemu.v1.NoSuchService"))


def test_the_plugin_adds_no_pytest_asyncio_warning_outside_the_repository(
    tmp_path: Path,
) -> None:
    """Issue 21, finding 19: a project without pytest-asyncio settings (any directory outside
    this repository) sees no deprecation warning once the plugin is loaded."""
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
        return subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    plain = run()
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "asyncio_default_fixture_loop_scope" not in plain.stdout + plain.stderr
    without = run("-p", "no:cmemu")  # the warning is pytest-asyncio's own, with no cmemu plugin
    assert without.returncode == 0
    assert "asyncio_default_fixture_loop_scope" in without.stdout + without.stderr


@pytest.mark.slow
# the scenario at x10, not the module's x20: the live serving deployment keeps pace on a loaded
# 2-core machine (the whole suite runs in parallel workers), so what is judged is the recovery;
# the emulator at x50, and the deployment warm (its weights load from EMS: 80 emulated s, not 640
# cold; the set-up is not what is judged), so that the set-up takes a few wall s
@pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=50, fresh="test")
def test_a_crashed_decode_npu_recovers_within_ten_minutes(chaos: Chaos) -> None:
    """The library's npu-crash-decode: detection, isolation, replacement and restore by the
    reference cluster manager and the serving deployment, judged from outside."""
    result = judged(lambda: chaos.run("npu-crash-decode", time_scale=10, warm=True))
    assert result.time_scale == 10
    assert result.ok, "\n".join(summary_lines(result))
    phases = {e.phase for e in result.timeline}
    assert {"fault", "detected", "isolated", "replaced", "restored"} <= phases
    (rec,) = result.recoveries
    assert rec.workloads == ("chat",)
    assert rec.recovery_s is not None and rec.recovery_s <= 600
    assert result.fault("crash").recovered_within("10m") == rec.recovery_s
