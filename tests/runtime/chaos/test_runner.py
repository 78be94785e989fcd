"""The chaos runner end to end against a real emulator (`cmemu up`, started by the cmemu pytest
plugin's `supernode` fixture): workloads started through the public APIs, faults injected on the
emulated schedule, the verdict judged from the manager's incidents and the workloads' status."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator.cli.chaos import summary_lines
from emulator.pytest_plugin import Chaos, RunningSupernode, WaitFor

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
    result = chaos.run(_write(tmp_path, LINKS_AND_OBJECTS))
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


def test_the_same_seed_picks_the_same_targets(chaos: Chaos, tmp_path: Path) -> None:
    path = _write(tmp_path, LINKS_AND_OBJECTS)
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
    result = chaos.run(_write(tmp_path, text))
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


@pytest.mark.slow
# at x10, not the module's x20: the live serving deployment keeps pace on a loaded 2-core
# machine (the whole suite runs in parallel workers), so what is judged is the recovery
@pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=10)
def test_a_crashed_decode_npu_recovers_within_ten_minutes(chaos: Chaos) -> None:
    """The library's npu-crash-decode: detection, isolation, replacement and restore by the
    reference cluster manager and the serving deployment, judged from outside."""
    result = chaos.run("npu-crash-decode")
    assert result.ok, "\n".join(summary_lines(result))
    phases = {e.phase for e in result.timeline}
    assert {"fault", "detected", "isolated", "replaced", "restored"} <= phases
    (rec,) = result.recoveries
    assert rec.workloads == ("chat",)
    assert rec.recovery_s is not None and rec.recovery_s <= 600
