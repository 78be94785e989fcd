"""`cmemu up` in every mode ends cleanly on SIGTERM in every phase: no traceback, every process
gone, and no run directory left behind (it is kept only when a process died)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.testing import CMEMU, free_port_block
from tests.runtime.test_procs import ROOT, kill_left_over, serve_processes

pytestmark = pytest.mark.slow
MODES = {
    # cm384 in process: long enough a start to interrupt, on a block of ports found free when
    # the test starts (not at import, long before: by then another test may hold them)
    "inprocess": ["--preset", "cm384"],
    "procs": ["--preset", "cm-mini", "--mode", "procs", "--per", "node"],
    "compose": ["--from-compose", str(ROOT / "compose" / "cm-mini.yaml")],
}


STDERR = "cmemu-up.stderr"


def _up(tmp_path: Path, mode: str, port: int) -> tuple[subprocess.Popen[str], Path]:
    state_file = tmp_path / "state" / "state.json"
    ports = ["--base-port", str(port)] if mode == "inprocess" else []
    # its logs to a file: an unread pipe fills at 64 KiB and blocks the launcher's event loop
    with (tmp_path / STDERR).open("w") as errors:
        proc = subprocess.Popen(
            [CMEMU, "up", *MODES[mode], *ports, "--state-file", str(state_file)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp_path)},  # its run directory: serve_processes
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
@pytest.mark.parametrize(
    "mode",
    [
        "inprocess",
        pytest.param("procs", marks=pytest.mark.xdist_group("loopback-procs")),
        pytest.param("compose", marks=pytest.mark.xdist_group("loopback-compose")),
    ],
)  # procs' and compose's fixed loopback addresses: see tests/conftest.py
def test_sigterm_ends_up_cleanly(tmp_path: Path, mode: str, phase: str) -> None:
    try:
        _ends_cleanly(tmp_path, mode, phase)
    finally:
        kill_left_over(tmp_path)


def _ends_cleanly(tmp_path: Path, mode: str, phase: str) -> None:
    port = free_port_block(server_count(build("cm384")), start=26100)
    proc, state_file = _up(tmp_path, mode, port)
    try:
        if phase == "starting":
            # once its loop runs: its first server listens, or its first process is started
            if mode == "inprocess":
                _wait_for(lambda: _listening(port))
            else:
                _wait_for(lambda: bool(serve_processes(tmp_path)))
            assert not state_file.exists(), "it finished starting too soon to test this"
        else:
            # (or it exited: what it said is asserted on below)
            _wait_for(lambda: state_file.exists() or proc.poll() is not None)
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            err = (tmp_path / STDERR).read_text()
            pytest.fail(f"no exit 120 s after SIGTERM:\n{out[-2000:]}\n{err[-4000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = (tmp_path / STDERR).read_text()
    assert "Traceback" not in err, err
    assert proc.returncode == 0, (out, err)
    assert "cmemu: stopped" in out
    if phase == "starting":
        assert "stopped while starting" in out
    assert not serve_processes(tmp_path), "a serve process outlived its supervisor"
    left = list(state_file.parent.iterdir()) if state_file.parent.exists() else []
    assert not left, f"left behind: {left}"
