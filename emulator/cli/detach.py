"""`cmemu up -d`: run `cmemu up` as a detached child and return once it is up (as `docker run -d`).

The child runs in its own session with stdout and stderr in `<state dir>/<name>.log`; this
process waits until the child has written the state file with its own pid (everything SERVING),
or has exited (then the log's tail explains why), prints the summary the child printed, and
returns. `cmemu down` stops the child later.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cmemu.emulator.model.topology import DNS_LABEL
from cmemu.emulator.runtime import state

LOG_SUFFIX = ".log"
TAIL_LINES = 20
SUMMARY_WAIT_S = 5.0


def cmemu_argv() -> list[str]:
    """How to run `cmemu` again: the console script beside this interpreter, else -m."""
    script = Path(sys.executable).parent / "cmemu"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cmemu.emulator.cli.main"]


def log_path(state_path: Path) -> Path:
    return state_path.with_name(f"{state.instance_name(state_path)}{LOG_SUFFIX}")


def _written_by(state_path: Path, pid: int) -> bool:
    try:
        doc = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return False  # not there yet (it is replaced atomically, never half written)
    return isinstance(doc, dict) and doc.get("launcher", {}).get("pid") == pid


def _human_lines(text: str) -> list[str]:
    """The child's own output, without its JSON log lines."""
    return [line for line in text.splitlines() if not line.lstrip().startswith("{")]


def up_detached(argv_without_d: Sequence[str], state_path: Path, timeout_s: float) -> int:
    """Start `cmemu ARGV` (the `up` command line without -d/--detach, global options first,
    naming `state_path` through --name or --state-file) detached; 0 once its state file holds
    its pid, 1 if it exits first or is not up within timeout_s (then it is stopped)."""
    log = log_path(state_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        child = subprocess.Popen(
            [*cmemu_argv(), *argv_without_d],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while not _written_by(state_path, child.pid):
        if time.monotonic() >= deadline:
            child.terminate()
            _print_tail(log, f"cmemu up -d: not up within {timeout_s:g} s; stopped it")
            return 1
        try:
            child.wait(timeout=0.05)  # returns at once if the child exits
        except subprocess.TimeoutExpired:
            continue
        _print_tail(log, f"cmemu up -d: `cmemu up` exited with code {child.returncode}")
        return 1
    # the child writes the state file, then prints its summary (which names the state file)
    summary_by = time.monotonic() + SUMMARY_WAIT_S
    text = log.read_text(errors="replace")
    while str(state_path) not in text and time.monotonic() < summary_by:
        try:
            child.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            text = log.read_text(errors="replace")
    text = log.read_text(errors="replace")
    for line in _human_lines(text):
        if "Ctrl-C" not in line:  # it is detached: `cmemu down` stops it
            print(line)
    name = state.instance_name(state_path)
    print(f"  log         {log}")
    print(f"  stop        cmemu down{_which(state_path, name)}")
    print(f"cmemu: running detached as pid {child.pid}", flush=True)
    return 0


def _which(state_path: Path, name: str) -> str:
    if state_path == state.resolve():
        return ""
    if DNS_LABEL.match(name) and state_path == state.path_for(name):
        return f" --name {name}"
    return f" --state-file {state_path}"


def _print_tail(log: Path, headline: str) -> None:
    lines = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    print(headline + f"; the end of its log {log}:", file=sys.stderr)
    for line in lines:
        print(f"  {line}", file=sys.stderr)
