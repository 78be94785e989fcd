"""`cmemu sched` as a user runs it, against a real `cmemu up` of cm-mini (16 NPUs, one rack)."""

from __future__ import annotations

import json
from pathlib import Path

from cmemu.emulator import testing
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.testing import free_port_block, run_cmemu

cmemu = run_cmemu


def test_sched_alloc_ls_replace_release(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build("cm-mini")))
    with testing.cmemu_up(
        state_file, "--preset", "cm-mini", "--base-port", str(base), timeout_s=60, quiet=True
    ):
        state = ("--state-file", str(state_file))

        def ok(*args: str) -> str:
            result = cmemu("sched", *args, *state)
            assert result.returncode == 0, (args, result.stderr)
            return result.stdout

        def fails(code: str, *args: str) -> str:
            result = cmemu("sched", *args, *state)
            assert result.returncode == 1, (args, result.stdout)
            assert code in result.stderr, result.stderr
            return result.stderr

        policies = json.loads(ok("policies", "--json"))
        assert [p["name"] for p in policies] == ["first-fit", "best-fit", "topology-aware"]
        assert [p["name"] for p in policies if p["default"]] == ["topology-aware"]
        assert "(default)" in ok("policies")
        spares = json.loads(ok("spares", "--json"))
        assert spares["target"] == 1 and len(spares["npus"]) == 1  # one rack, one spare

        out = ok("alloc", "decode", "--npus", "8", "--whole-nodes", "--priority", "2")
        assert "allocated decode: 8 NPUs on 1 node" in out
        assert ".d0,n0" in out  # each NPU's dies
        p0 = json.loads(ok("alloc", "p0", "--npus", "4", "--policy", "best-fit", "--json"))
        assert len(p0["npu_ids"]) == 4 and p0["policy"] == "best-fit"
        assert not set(p0["npu_ids"]) & set(spares["npus"])

        listing = ok("ls")
        assert [line.split()[0] for line in listing.splitlines()[1:3]] == ["decode", "p0"]
        assert "16 NPUs: 12 allocated, 3 free, 1 spare, 0 failed" in listing
        rows = json.loads(ok("ls", "--json"))
        assert rows["free_npus"] == 3 and rows["allocations"][0]["priority"] == 2

        victim = p0["npu_ids"][0]
        out = ok("replace", "p0", "--npu", victim)
        assert f"replaced {victim} -> {spares['npus'][0]}" in out
        assert "0 spare NPUs (target 0)" in ok("spares", "--set", "0")
        fails("RESOURCE_EXHAUSTED (NO_SPARES)", "replace", "p0", "--npu", spares["npus"][0])
        fails("FAILED_PRECONDITION (NOT_IN_JOB)", "replace", "decode", "--node", "n01")
        fails("OUT_OF_RANGE (TOO_MANY_NPUS)", "alloc", "big", "--npus", "100")
        fails("NOT_FOUND (UNKNOWN_POLICY)", "alloc", "x", "--npus", "1", "--policy", "random")
        fails("RESOURCE_EXHAUSTED (NO_ROOM)", "alloc", "x", "--npus", "5")
        fails("INVALID_ARGUMENT", "alloc", "x y", "--npus", "1")

        assert "released decode: 8 NPUs" in ok("release", "decode")
        fails("NOT_FOUND (JOB_NOT_FOUND)", "release", "decode")
        assert "spare NPUs (target 2)" in ok("spares", "--set", "2")

    for usage in (
        ["sched", "alloc", "j", "--npus", "0"],
        ["sched", "alloc", "j"],
        ["sched", "replace", "j"],
        ["sched", "replace", "j", "--npu", "n00-npu0", "--node", "n00"],
        ["sched", "spares", "--set", "-1"],
    ):
        result = cmemu(*usage)
        assert result.returncode == 2, usage
