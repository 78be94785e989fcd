"""Abort conditions (issue 20 item 6): a bound crossed while the run goes on halts the attack
(every fault cleared at once, nothing more injected) and fails the run naming the bound; its
twin, with a bound the same run stays within, runs its whole schedule and passes. In-process
cm-mini at x50 (one emulator for the module), each run a few emulated minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.model.chaos.scenario import parse_scenario
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.pytest_plugin import Chaos, RunningSupernode, WaitFor
from tests.runtime.chaos.test_must_fail import _failed, _open_incidents, _run

pytestmark = pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=50)

# the first fault's incident is open for about 30 s; the second goes in after it is restored
SCENARIO = """version: 1
name: abort-{bound}
seed: 1
abort: {{open_incidents: {bound}}}
workloads:
  ems: {{objects: 4, size: 1KiB, prefix: test/abort/}}
steps:
  - {{id: first, at: 5s, fault: device-down, target: {{npu: n00-npu1}}, duration: 30s}}
  - {{id: second, at: 80s, fault: device-down, target: {{npu: n01-npu2}}, duration: 10s}}
expect:
  recovered_within: 2m
"""


def _settled(supernode: RunningSupernode, wait_for: WaitFor) -> None:
    wait_for(lambda: not _open_incidents(supernode), within_emulated_s=300)


def test_an_open_incident_past_the_bound_halts_the_attack_and_fails(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor, tmp_path: Path
) -> None:
    _settled(supernode, wait_for)
    result = _run(chaos, tmp_path, SCENARIO.format(bound=0))
    assert not result.ok, "\n".join(summary_lines(result))
    check = _failed(result)["abort"]
    assert check.measured.startswith("1 open incidents > 0: n00-npu1"), check.measured
    assert check.detail.startswith("halted at +") and "nothing more injected" in check.detail
    (first,) = result.observations.injections  # the second step never went in
    assert first.label == "first" and first.cleared_ns is not None
    # cleared by the halt, well before its own 30 s
    assert first.cleared_ns - first.at_ns < 30 * 10**9
    _settled(supernode, wait_for)


def test_its_twin_within_the_bound_runs_the_whole_schedule_and_passes(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor, tmp_path: Path
) -> None:
    _settled(supernode, wait_for)
    result = _run(chaos, tmp_path, SCENARIO.format(bound=1))
    assert result.ok, "\n".join(summary_lines(result))
    assert [i.label for i in result.observations.injections] == ["first", "second"]
    assert "abort" not in [c.name for c in result.verdict.checks]
    assert not result.observations.aborted


@pytest.mark.parametrize(
    ("abort", "field"),
    [({}, "abort"), ({"failed": 1}, "abort.failed"),
     ({"open_incidents": -1}, "abort.open_incidents"),
     ({"failed_requests": "many"}, "abort.failed_requests"), ([1], "abort")],
)  # fmt: skip
def test_a_bad_abort_condition_is_refused_naming_it(abort: object, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_scenario({"version": 1, "name": "x", "abort": abort})
    assert caught.value.field == field, str(caught.value)
