"""Progress bars: drawn on a terminal (a real pseudo-terminal here), never into a pipe.

`cmemu up --mode procs` takes several seconds to boot, longer than the bar's delay, and a
transfer at a slow time scale is paced for seconds: both draw a bar on a terminal, and the same
commands with their output piped (as every other test runs them) print none of it.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cmemu.emulator.cli import progress
from cmemu.emulator.cli.progress import DELAY_ENV
from cmemu.emulator.testing import CMEMU, MINI_PORTS, cmemu_up, free_port_block, run_cmemu

BOOT_BAR = "starting processes, wave"


def in_terminal(
    argv: list[str],
    *,
    stop_when: Callable[[bytes], bool],
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> str:
    """Run `argv` with a pseudo-terminal as stdin, stdout and stderr; SIGINT once `stop_when`
    holds for what it printed so far; everything it printed."""
    master, slave = pty.openpty()
    environ = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True, env=environ
    )
    os.close(slave)
    out, signalled = b"", False
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the other end closed: the process has exited
                    break
                if not data:
                    break
                out += data
            if not signalled and stop_when(out):
                proc.send_signal(signal.SIGINT)
                signalled = True
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        os.close(master)
    return out.decode(errors="replace")


def test_bars_only_on_a_terminal(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as tty, (tmp_path / "file").open("w") as file:
        assert progress.wanted(tty)
        assert not progress.wanted(file)
    os.close(master)


@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
def test_boot_bar_on_a_terminal_and_not_in_a_pipe(tmp_path: Path) -> None:
    state = tmp_path / "tty.json"
    # each node's process on its own loopback address, on a port no other run is using right
    # now: one process per node (9 with the services') draws the same waves as one per device
    # (32), for a fifth of the CPU
    procs = ["--mode", "procs", "--per", "node", "--port", str(free_port_block(1))]
    procs += ["--metrics", "none", "--broker", "none", "--ui", "none"]
    argv = [CMEMU, "--log-level", "warning", "up", "--preset", "cm-mini", *procs]
    argv += ["--state-file", str(state)]
    # a bar at once: the forked cm-mini boots in about 2 s, the default delay (a quiet host
    # booted it before the bar's turn came, and the test read a bar that was never due)
    shown = in_terminal(
        argv, stop_when=lambda out: b"  stop " in out, timeout_s=120, env={DELAY_ENV: "0"}
    )
    assert "is up as" in shown
    assert BOOT_BAR in shown

    output: list[str] = []
    piped = tmp_path / "pipe.json"
    procs[procs.index("--port") + 1] = str(free_port_block(1))
    with cmemu_up(piped, "--preset", "cm-mini", *procs, output=output, env={DELAY_ENV: "0"}):
        pass
    assert "is up as" in output[0]
    assert BOOT_BAR not in output[0]


def test_transfer_bar_on_a_terminal_only(tmp_path: Path) -> None:
    state = tmp_path / "x.json"
    port = free_port_block(MINI_PORTS)
    up = ("--preset", "cm-mini", "--base-port", str(port), "--broker", "none", "--ui", "none")
    # 100 GB at about 134 GB/s is 0.75 s emulated: 3.75 s of wall time at time scale 0.2, at
    # least (a busy host only dilates emulated time), past the bar's delay (progress.DELAY_S, 2 s)
    # in the terminal, so that the piped run's missing bar is one that would have been drawn
    with cmemu_up(state, *up, "--time-scale", "0.2", quiet=True):
        xfer = ["xfer", "n00-npu0", "n01-npu3", "--bytes", "100GB", "--state-file", str(state)]
        shown = in_terminal([CMEMU, *xfer], stop_when=lambda out: False, timeout_s=120)
        assert "write 100000000000 bytes n00-npu0 -> n01-npu3" in shown  # the result line
        assert "write 100,000,000,000 bytes" in shown  # the bar's description
        piped = run_cmemu(*xfer, timeout=120)
        assert piped.returncode == 0, piped.stderr
        assert "100,000,000,000" not in piped.stdout + piped.stderr


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_progress_delay_is_refused_before_anything_starts(value: str, tmp_path: Path) -> None:
    """In a pipe too, where no bar would show; the twin is the piped boot above, delay "0"."""
    state = tmp_path / "s.json"
    up = ["up", "--preset", "cm-mini", "--broker", "none", "--ui", "none"]
    up += ["--base-port", str(free_port_block(MINI_PORTS)), "--state-file", str(state)]
    refused = run_cmemu(*up, env={DELAY_ENV: value}, timeout=120)  # not refused: it would serve
    assert refused.returncode != 0
    assert f"${DELAY_ENV}={value!r}" in refused.stderr
    assert not state.exists()
