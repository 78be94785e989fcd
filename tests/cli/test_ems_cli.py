"""`cmemu ems ls|rm|exists` as a user runs them, against a real `cmemu up`."""

from __future__ import annotations

import json
from pathlib import Path

from cmemu.emulator import testing
from cmemu.emulator.testing import MINI_PORTS, free_port_block, run_cmemu

cmemu = run_cmemu


def test_ems_ls_rm_exists(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(MINI_PORTS)
    with testing.cmemu_up(
        state_file, "--preset", "cm-mini", "--base-port", str(base), timeout_s=60, quiet=True
    ):
        state = ("--state-file", str(state_file))
        blob = tmp_path / "blob"
        blob.write_bytes(b"0123456789")
        for key in ("kv-1", "kv-2", "weights-0"):
            put = cmemu("ems", "put", key, str(blob), *state)
            assert put.returncode == 0, put.stderr

        ls = cmemu("ems", "ls", *state)
        assert ls.returncode == 0, ls.stderr
        assert [line.split()[0] for line in ls.stdout.splitlines()[:3]] == [
            "kv-1",
            "kv-2",
            "weights-0",
        ]
        assert "3 objects, 30 bytes" in ls.stdout
        rows = json.loads(cmemu("ems", "ls", "--prefix", "kv-", "--json", *state).stdout)
        assert [r["key"] for r in rows] == ["kv-1", "kv-2"]
        assert rows[0]["size"] == 10 and rows[0]["tier"] == "dram"
        assert len(rows[0]["replicas"]) == 2 and rows[0]["kind"] == "kv"

        yes = cmemu("ems", "exists", "kv-1", *state)
        assert (yes.returncode, yes.stdout.strip()) == (0, "yes")
        rm = cmemu("ems", "rm", "kv-1", *state)
        assert rm.returncode == 0 and "removed kv-1" in rm.stdout
        no = cmemu("ems", "exists", "kv-1", *state)
        assert (no.returncode, no.stdout.strip()) == (1, "no")
        again = cmemu("ems", "rm", "kv-1", *state)
        assert again.returncode == 1 and "no object 'kv-1'" in again.stderr
        bad = cmemu("ems", "exists", "a|b", *state)
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr
        assert cmemu("ems", "ls", "--json", "--prefix", "zzz", *state).stdout.strip() == "[]"

    for usage in (["ems", "rm"], ["ems", "exists"], ["ems", "ls", "--bogus"]):
        result = cmemu(*usage)
        assert result.returncode == 2, usage


def test_ems_get_of_size_only_objects_and_from_a_dead_device(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(MINI_PORTS)
    with testing.cmemu_up(
        state_file, "--preset", "cm-mini", "--base-port", str(base), timeout_s=60, quiet=True
    ):
        state = ("--state-file", str(state_file))
        blob = tmp_path / "blob"
        blob.write_bytes(bytes(3 * 2**20 + 5))  # over one chunk: streamed
        assert cmemu("ems", "put", "bulk", str(blob), "--size-only", *state).returncode == 0
        assert cmemu("ems", "put", "real", str(blob), *state).returncode == 0
        out = tmp_path / "out"
        refused = cmemu("ems", "get", "bulk", "-o", str(out), *state)
        assert refused.returncode == 1 and "size-only" in refused.stderr
        assert not out.exists()
        sized = cmemu("ems", "get", "bulk", "--size-only", *state)
        assert sized.returncode == 0 and "3145733 bytes" in sized.stdout
        assert "us emulated" in sized.stdout and not out.exists()
        real = cmemu("ems", "get", "real", "-o", str(out), *state)
        assert real.returncode == 0, real.stderr
        assert out.read_bytes() == blob.read_bytes()
        down = cmemu("fault", "add", "device-down", "n00-npu3", *state)
        assert down.returncode == 0, down.stderr
        dead = cmemu("ems", "get", "real", "-o", str(out), "--device", "n00-npu3", *state)
        assert dead.returncode == 1
        assert "reading device n00-npu3" in dead.stderr and "no copy" not in dead.stderr
