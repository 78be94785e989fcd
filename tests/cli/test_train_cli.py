"""`cmemu train`, `cmemu manager` and `cmemu simulate training` as a user runs them."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cmemu.emulator import testing
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.testing import free_port_block, run_cmemu


def test_simulate_training_prints_goodput_and_recovery_times() -> None:
    args = ("simulate", "training", "--preset", "cm-mini", "--npus", "16", "--days", "40")
    out = run_cmemu(*args, "--mtbf-hours", "2000", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["days"] == 40 and report["npus"] == 16 and report["failures"] > 0
    assert 0 < report["goodput"] < 1 and report["recovery_p99_s"] >= report["recovery_p50_s"] > 0
    table = run_cmemu(*args, "--mtbf-hours", "2000")
    assert table.returncode == 0 and "goodput" in table.stdout and "recovery_p99_s" in table.stdout
    bad = run_cmemu(*args, "--mtbf-hours", "-3")
    assert bad.returncode == 1 and "mtbf_hours must be > 0" in bad.stderr
    too_many = run_cmemu("simulate", "training", "--preset", "cm-mini", "--npus", "99")
    assert too_many.returncode == 1 and "npus must be 1..16" in too_many.stderr


# a bound that only ends a hung test: each poll is a `cmemu` process of its own, which takes
# seconds on a loaded host (60 s once failed at a load average of 8 with nothing wrong)
HANG_GUARD_S = 600.0


def test_train_and_manager_against_a_running_supernode(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build("cm-mini")))
    up = ("--preset", "cm-mini", "--base-port", str(base), "--time-scale", "50")
    with testing.cmemu_up(state_file, *up, timeout_s=60, quiet=True):
        state = ("--state-file", str(state_file))

        def ok(*args: str) -> str:
            result = run_cmemu(*args, *state)
            assert result.returncode == 0, (args, result.stderr)
            return result.stdout

        status = json.loads(ok("manager", "status", "--json"))
        assert status["mode"] == "MANAGER_MODE_ACTIVE" and status["devices_watched"] == 26
        assert "mode passive" in ok("manager", "mode", "passive")
        assert "mode active" in ok("manager", "mode", "active")
        assert ok("manager", "incidents") == "no incidents\n"
        started = json.loads(ok("train", "start", "t1", "--npus", "2", "--steps", "3", "--json"))
        assert started["name"] == "t1" and len(started["npus"]) == 2
        deadline = time.monotonic() + HANG_GUARD_S
        while json.loads(ok("train", "get", "t1", "--json"))["state"] != "finished":
            assert time.monotonic() < deadline, "the job never finished"
            time.sleep(0.2)
        listing = ok("train", "ls")
        assert listing.split("\n")[1].split()[:3] == ["t1", "finished", "3"]
        again = run_cmemu("train", "start", "Bad!", "--npus", "1", *state)
        assert again.returncode == 1 and "INVALID_ARGUMENT" in again.stderr
        missing = run_cmemu("train", "get", "nope", *state)
        assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr

        # stopped with a checkpoint of its last step, resumed from it (a day plan's night)
        ok("train", "start", "t2", "--npus", "2", "--checkpoint-every", "100")
        deadline = time.monotonic() + HANG_GUARD_S
        while json.loads(ok("train", "get", "t2", "--json")).get("step", "0") == "0":
            assert time.monotonic() < deadline, "the job never stepped"
            time.sleep(0.2)
        ok("train", "stop", "t2", "--checkpoint")
        while (job := json.loads(ok("train", "get", "t2", "--json")))["state"] != "stopped":
            assert time.monotonic() < deadline, "the job never stopped"
            time.sleep(0.2)
        assert job["last_checkpoint_step"] == job["step"]
        mismatch = run_cmemu("train", "start", "t2", "--npus", "4", "--resume", *state)
        assert mismatch.returncode == 1 and "RESUME_MISMATCH" in mismatch.stderr
        resumed = json.loads(ok("train", "start", "t2", "--npus", "2", "--resume", "--json"))
        assert resumed["step"] == job["step"]
        ok("train", "stop", "t2")
        usage = run_cmemu("manager", "mode", "sideways", *state)
        assert usage.returncode == 2
