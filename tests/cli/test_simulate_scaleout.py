"""`cmemu simulate scaleout` as a user runs it: a real process, the step and its linearity out;
a bad preset, too many supernodes or a bad oversubscription a message and exit 1."""

from __future__ import annotations

import json

from cmemu.emulator.testing import run_cmemu


def test_simulate_scaleout_prints_the_step_its_phases_and_linearity() -> None:
    out = run_cmemu("simulate", "scaleout", "--preset", "cm-minix4", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["preset"] == "cm-minix4" and report["supernode"] == "cm-mini"
    assert report["supernodes"] == 4 and report["npus"] == 64
    assert report["step_s"] > report["step_one_s"] > report["compute_s"] > 0
    assert report["reduce_scatter_s"] > 0 and report["cross_s"] > 0 and report["all_gather_s"] > 0
    assert 0 < report["linearity"] < 1 and report["overlap"] is True
    squeezed = run_cmemu(
        "simulate", "scaleout", "--preset", "cm-minix4", "--oversubscription", "4", "--json"
    )
    assert squeezed.returncode == 0, squeezed.stderr
    worse = json.loads(squeezed.stdout)
    assert worse["cross_s"] > report["cross_s"] and worse["linearity"] < report["linearity"]
    table = run_cmemu(
        "simulate", "scaleout", "--preset", "cm-minix2", "--algorithm", "ring", "--no-overlap"
    )
    assert table.returncode == 0, table.stderr
    lines = dict(line.split(None, 1) for line in table.stdout.splitlines())
    assert lines["algorithm"] == "ring" and lines["overlap"] == "False"
    assert lines["cross_s"].endswith(" ms") and "linearity" in lines


def test_simulate_scaleout_refuses_bad_input_with_a_message() -> None:
    unknown = run_cmemu("simulate", "scaleout", "--preset", "nope")
    assert unknown.returncode == 1 and "unknown preset 'nope'" in unknown.stderr
    too_many = run_cmemu("simulate", "scaleout", "--preset", "cm384x433")
    assert too_many.returncode == 1
    assert "433 supernodes exceed the 432" in too_many.stderr
    loose = run_cmemu("simulate", "scaleout", "--preset", "cm-minix2", "--oversubscription", "0.5")
    assert loose.returncode == 1 and "oversubscription must be >= 1" in loose.stderr
    for out in (unknown, too_many, loose):
        assert "Traceback" not in out.stderr
    usage = run_cmemu("simulate", "scaleout", "--algorithm", "tree")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
