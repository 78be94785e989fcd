"""`cmemu chaos` as a user runs it: `cmemu up` in the background, then `cmemu chaos run FILE`
with its timeline, exit code, JUnit and JSON; `cmemu chaos ls`; bad files and options."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from xml.etree import ElementTree as ET

from cmemu.emulator import testing
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.testing import free_port_block, run_cmemu

HOLDS = """
version: 1
name: cli-holds
workloads:
  ems: {objects: 4, size: 1KiB, prefix: cli/}
steps:
  - {id: cut, at: 5s, fault: link-down, target: {link: random}, duration: 10s}
expect:
  recovered_within: 10m
  lost_objects: 0
"""
ABORTED_EXIT = 3  # the lag guard: a host too busy to keep pace judged nothing


def _judged(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`cmemu chaos run`, run again (up to 3 times) when the host did not let it keep pace:
    an ABORTED run is no verdict, and a busy host must not fail the test."""
    for _ in range(3):
        run = run_cmemu("chaos", "run", *args, timeout=timeout)
        if run.returncode != ABORTED_EXIT:
            break
    return run


FAILS = (
    HOLDS.replace("name: cli-holds", "name: cli-fails")
    .replace("link-down", "switch-down")
    .replace("{link: random}", "{switch: l2-p0-s99}")
)


def test_chaos_run_prints_the_timeline_and_judges(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build("cm-mini")))
    (tmp_path / "holds.yaml").write_text(HOLDS)
    (tmp_path / "fails.yaml").write_text(FAILS)
    # time scale 40: every bound here is emulated time (the clock dilates on a busy host), and a
    # run that could not keep pace is ABORTED, no verdict, and run again (_judged)
    with testing.cmemu_up(
        state_file, "--preset", "cm-mini", "--base-port", str(base), "--time-scale", "40",
        "--broker", "none", timeout_s=60, quiet=True,
    ):  # fmt: skip
        state = ("--state-file", str(state_file))
        junit = tmp_path / "out.xml"
        run = _judged(str(tmp_path / "holds.yaml"), "--junit", str(junit), "--warm", *state,
                      timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert "fault" in run.stdout and "cleared" in run.stdout
        assert "PASS recovered_within" in run.stdout and "PASS lost_objects" in run.stdout
        assert "PASS: scenario cli-holds" in run.stdout
        suite = ET.parse(junit).getroot().find("testsuite")
        assert suite is not None and suite.get("failures") == "0"
        cases = [c.get("name") for c in suite.iter("testcase")]
        assert cases == ["faults_injected", "recovered_within", "lost_objects"]

        run = _judged(str(tmp_path / "fails.yaml"), "--json", "--junit", str(junit), *state,
                      timeout=300)  # fmt: skip
        assert run.returncode == 1, run.stdout + run.stderr
        doc = json.loads(run.stdout)
        assert doc["ok"] is False and doc["scenario"] == "cli-fails"
        failed = [c for c in doc["checks"] if not c["ok"]]
        assert [c["name"] for c in failed] == ["faults_injected", "recovered_within"]
        assert "NOT_FOUND" in failed[0]["detail"]
        suite = ET.parse(junit).getroot().find("testsuite")
        assert suite is not None and suite.get("failures") == "2"
        assert suite.find("testcase/failure") is not None

        # the seed comes from the command line too; a bad one is a usage error
        run = run_cmemu("chaos", "run", str(tmp_path / "holds.yaml"), "--seed", "-1", *state)
        assert run.returncode == 2 and "seed" in run.stderr

        # a schedule: two runs, the second 150 emulated s after the first started (which ends
        # before: early, once its 10 s cut is cleared and 60 s settled), its seed one higher;
        # each judged, JSON per run
        run = _judged(str(tmp_path / "holds.yaml"), "--repeat", "2", "--every", "150s", "--seed",
                      "7", "--json", *state, timeout=600)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        doc = json.loads(run.stdout)
        assert doc["ok"] is True and [r["run"] for r in doc["runs"]] == [1, 2]
        assert [r["seed"] for r in doc["runs"]] == [7, 8]
        assert doc["runs"][1]["started_s"] >= 150.0  # emulated: it waited for its instant
        assert doc["runs"][1]["late_s"] == 0.0
        # its twin: a scenario that fails fails the schedule, every run in the JUnit file
        run = _judged(str(tmp_path / "fails.yaml"), "--repeat", "2", "--junit", str(junit),
                      *state, timeout=600)  # fmt: skip
        assert run.returncode == 1, run.stdout + run.stderr
        assert "schedule of cli-fails: 0 of 2 runs passed" in run.stdout
        names = [s.get("name") for s in ET.parse(junit).getroot().iter("testsuite")]
        assert names == ["chaos.cli-fails", "chaos.cli-fails.run2"]
        for bad, why in [
            (["--every", "1m"], "every needs repeat"),
            (["--repeat", "0"], "--repeat"),
            (["--repeat", "2", "--keep"], "--keep"),
        ]:
            run = run_cmemu("chaos", "run", str(tmp_path / "holds.yaml"), *bad, *state)
            assert run.returncode == 2 and why in run.stderr, (bad, run.stderr)


def test_chaos_run_refuses_a_bad_file_naming_the_yaml_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(HOLDS.replace("at: 5s", "at: 5 parsecs"))
    run = run_cmemu("chaos", "run", str(bad), "--state-file", str(tmp_path / "none.json"))
    assert run.returncode == 2
    assert "steps[0].at" in run.stderr and "Traceback" not in run.stderr
    run = run_cmemu("chaos", "run", "no-such-scenario")
    assert run.returncode == 1 and "NOT_FOUND" in run.stderr and "Traceback" not in run.stderr


def test_chaos_ls_lists_the_kinds_and_the_library() -> None:
    run = run_cmemu("chaos", "ls")
    assert run.returncode == 0, run.stderr
    for name in ("crash", "hang", "node-power-off", "link-flap", "npu-crash-decode",
                 "mixed-storm"):  # fmt: skip
        assert name in run.stdout
    assert "BROKEN" not in run.stdout
    doc = json.loads(run_cmemu("chaos", "ls", "--json").stdout)
    assert {"crash", "switch-down"} <= {k["kind"] for k in doc["kinds"]}
    assert len(doc["scenarios"]) >= 7
