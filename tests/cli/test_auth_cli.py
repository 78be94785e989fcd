"""Tokens through the command line, as a user meets them: `cmemu up --token-file` in processes
(devices reach each other over gRPC, carrying the token), client commands that find the token
themselves, a raw grpcurl that does not, and binding beyond loopback refused."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cmemu.emulator.runtime import state
from cmemu.emulator.testing import MINI_SERVERS, cmemu_up, free_port_block, run_cmemu

TOKEN = "cli-test-token-0123456789"
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


cmemu = run_cmemu


@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
def test_procs_with_a_token_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    state_file = tmp_path / "auth.json"
    port = free_port_block(1)
    args = ("--preset", "cm-mini", "--mode", "procs", "--per", "node", "--port", str(port))
    with cmemu_up(
        state_file, *args, "--broker", "none", "--token-file", str(token_file), quiet=True
    ):
        text = state_file.read_text()
        assert TOKEN not in text  # never the token itself
        record = json.loads(text)["launcher"]
        kept = Path(record["token_file"])
        assert kept == state.token_path(state_file) and kept.read_text().strip() == TOKEN
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        s = ("--state-file", str(state_file))

        ls = cmemu("ls", *s)
        serving = f"{MINI_SERVERS}/{MINI_SERVERS} SERVING"
        assert ls.returncode == 0 and serving in ls.stdout, ls.stdout + ls.stderr
        faults = cmemu("fault", "ls", *s)
        assert faults.returncode == 0, faults.stderr
        # a write from n00-npu0 into n01-mem: device -> fabric -> device, three processes
        xfer = cmemu("xfer", "n00-npu0", "n01-mem", "--bytes", "4096", "--json", *s)
        assert xfer.returncode == 0, xfer.stderr
        assert json.loads(xfer.stdout)["emulated_us"] > 0

        npu = json.loads(text)["devices"][0]["address"]
        body = '{"size": 4096}'
        raw = subprocess.run(
            [GRPCURL, "-plaintext", "-d", body, npu, "cmemu.v1.Device/AllocateRegion"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert raw.returncode != 0 and "Unauthenticated" in raw.stderr, raw.stderr
        info = subprocess.run(
            [GRPCURL, "-plaintext", npu, "cmemu.v1.Device/GetInfo"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert info.returncode == 0, info.stderr  # reads stay open
    assert not state.token_path(state_file).exists()  # removed with the state file


def test_binding_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    env = {"CMEMU_STATE_DIR": str(tmp_path)}
    up = cmemu("up", "--preset", "cm-mini", "--host", "0.0.0.0", "--broker", "none", env=env)
    assert up.returncode == 1
    assert "0.0.0.0" in up.stderr and "--token-file" in up.stderr and "--insecure" in up.stderr
    assert not list(tmp_path.glob("*.json"))

    topology = tmp_path / "topology.json"
    doc = cmemu("topology", "--preset", "cm-mini", "--host", "0.0.0.0", "--json")
    topology.write_text(doc.stdout)
    serve = cmemu(
        "serve",
        "--topology",
        str(topology),
        "--device",
        "n00-npu0",
        env={"CMEMU_EPOCH": "1", "CMEMU_TOKEN_FILE": ""},
    )
    assert serve.returncode == 1 and "refusing to bind n00-npu0" in serve.stderr, serve.stderr


def test_tls_flags_that_do_not_go_together_are_usage_errors(tmp_path: Path) -> None:
    env = {"CMEMU_STATE_DIR": str(tmp_path)}
    only_cert = cmemu("up", "--preset", "cm-mini", "--tls-cert", "x.pem", env=env)
    assert only_cert.returncode == 2 and "--tls-key" in only_cert.stderr
    both = cmemu("up", "--tls", "auto", "--tls-cert", "a", "--tls-key", "b", env=env)
    assert both.returncode == 2
