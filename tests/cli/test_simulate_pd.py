"""`cmemu simulate pd` as a user runs it: a real process, the split over time, the switches and
goodput out; bad options get a message and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmemu.emulator.testing import run_cmemu

ROOT = Path(__file__).resolve().parents[2]
PD = ("simulate", "pd", "--deployment", str(ROOT / "examples/deployments/pd-64.yaml"))
MIX = ("--workload", str(ROOT / "examples/workloads/shifting-mix.yaml"))


def test_simulate_pd_prints_the_split_switches_and_goodput() -> None:
    done = run_cmemu(*PD, *MIX, "--duration", "1800", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["policy"] == "dynamic" and doc["units"] == 4
    assert doc["switches"][0]["to"] == "prefill"  # long prompts first: prefill grows
    assert doc["trace"][-1]["prefill"] == 3 and doc["goodput_per_s"] > 0
    table = run_cmemu(*PD, *MIX, "--duration", "600", "--pd", "fixed")
    assert table.returncode == 0, table.stderr
    assert "P:D" in table.stdout and " 2:2 " in table.stdout and "goodput" in table.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--pd", "random"), 2, "invalid choice: 'random'"),
        (("--prefill-units", "4"), 1, "prefill_units must be 1..3"),
        (("--headroom", "-1"), 1, "headroom must be >= 0"),
        (("--interval", "0"), 2, "--interval"),
        (("--set", "serving.nope=1"), 1, "nope"),
    ],
)
def test_bad_options_are_refused(args: tuple[str, ...], code: int, message: str) -> None:
    done = run_cmemu(*PD, *MIX, "--duration", "60", *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_bad_phase_is_named(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text("phases: [{duration_s: -5}]\n")
    done = run_cmemu(*PD, "--workload", str(workload))
    assert done.returncode == 1 and "phases[0]: need duration_s > 0" in done.stderr
