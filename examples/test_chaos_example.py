"""A chaos test to copy into your own project (`pip install cloudmatrix-emulator` enables the
cmemu pytest plugin). Run it with `pytest examples/test_chaos_example.py`: the plugin starts a
cm-mini supernode at 20 emulated seconds per wall second and stops it at the end.

Point `scenario` at your own YAML (see scenarios/ and scenarios/schema.json), and your controller
at the emulator's scheduler, fault and event APIs; the verdict judges whichever controller runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cmemu.emulator.cli.chaos import summary_lines
from cmemu.emulator.pytest_plugin import Chaos, RunningSupernode, WaitFor

pytestmark = pytest.mark.supernode(preset="cm-mini", mode="inprocess", time_scale=20)

SCENARIO = """
version: 1
name: link-loss-example
seed: 1
workloads:
  ems: {objects: 16, size: 4KiB, prefix: example/}
steps:
  - {id: cut, at: 10s, fault: link-down, target: {link: random in node n01}, duration: 30s}
  - {after: cut, delay: 5s, fault: switch-down, target: {switch: random in node n00}, duration: 20s}
expect:
  recovered_within: 10m
  lost_objects: 0
"""


def test_a_scenario_holds(chaos: Chaos, tmp_path: Path) -> None:
    scenario = tmp_path / "example.yaml"
    scenario.write_text(SCENARIO)
    result = chaos.run(scenario)
    assert result.ok, "\n".join(summary_lines(result))


def test_a_faulted_device_stops_serving_at_once(
    chaos: Chaos, supernode: RunningSupernode, wait_for: WaitFor
) -> None:
    chaos.inject("device-down", "n00-npu3")  # cleared by the fixture after the test
    took = wait_for(
        lambda: supernode.call(lambda c: c.health("n00-npu3")) == "NOT_SERVING",
        within_emulated_s=30,
    )
    assert took <= 30
