"""`cmemu up` in every mode ends cleanly on SIGTERM in every phase: no traceback, every process
gone, and no run directory left behind (it is kept only when a process died)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from emulator.model.topology import build, server_count
from emulator.testing import CMEMU, free_port_block
from tests.runtime.test_procs import ROOT, serve_processes

pytestmark = pytest.mark.slow
# cm384 in process: long enough a start to interrupt, on ports nothing else holds
INPROCESS_PORT = free_port_block(server_count(build("cm384")), start=26100)

MODES = {
    "inprocess": ["--preset", "cm384", "--base-port", str(INPROCESS_PORT)],
    "procs": ["--preset", "cm-mini", "--mode", "procs", "--per", "node"],
    "compose": ["--from-compose", str(ROOT / "compose" / "cm-mini.yaml")],
}


def _up(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    state_file = tmp_path / "state" / "state.json"
    proc = subprocess.Popen(
        [CMEMU, "up", *MODES[mode], "--state-file", str(state_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, state_file


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _wait_for(check: object, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize("phase", ["starting", "serving"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_sigterm_ends_up_cleanly(tmp_path: Path, mode: str, phase: str) -> None:
    proc, state_file = _up(tmp_path, mode)
    try:
        if phase == "starting":
            # once its loop runs: its first server listens, or its first process is started
            if mode == "inprocess":
                _wait_for(lambda: _listening(INPROCESS_PORT))
            else:
                _wait_for(lambda: bool(serve_processes()))
            assert not state_file.exists(), "it finished starting too soon to test this"
        else:
            _wait_for(state_file.exists)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no exit 120 s after SIGTERM:\n{out[-2000:]}\n{err[-4000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err
    assert proc.returncode == 0, (out, err)
    assert "cmemu: stopped" in out
    if phase == "starting":
        assert "stopped while starting" in out
    assert not serve_processes(), "a serve process outlived its supervisor"
    left = list(state_file.parent.iterdir()) if state_file.parent.exists() else []
    assert not left, f"left behind: {left}"
