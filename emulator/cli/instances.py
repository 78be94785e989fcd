"""Named instances: `cmemu down`, `cmemu instances`, and the check `cmemu up` makes first.

An instance is a state file (emulator/runtime/state.py) whose launcher pid is alive; a state file
whose launcher is gone is stale, and whoever meets one says so and removes it.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

from cmemu.emulator.cli import argtypes
from cmemu.emulator.cli.output import print_rows
from cmemu.emulator.model.errors import EmulatorError, NotFoundError, UnavailableError
from cmemu.emulator.runtime import state

DOWN_TIMEOUT_S = 60.0


def check_not_running(path: Path) -> None:
    """Before `cmemu up` writes `path`: raise state.AlreadyRunningError when the instance that
    wrote it is alive; remove the file (saying so on stderr) when its launcher is gone."""
    # imported here, by `cmemu up` alone: runtime.instance brings the whole launcher (the
    # emulator, compose, the web view), 0.3 CPU s that `down` and `instances` do not need
    from cmemu.emulator.runtime import instance

    pid = instance.stale_removed(path)
    if pid is not None:
        print(
            f"cmemu: removed the stale state file {path} (launcher pid {pid} is gone)",
            file=sys.stderr,
        )


def wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait until process `pid` has exited; whether it did within timeout_s. Sleeps on a pidfd
    (woken by the exit itself) where the kernel has them, else polls."""
    deadline = time.monotonic() + timeout_s
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    try:
        while state.pid_alive(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if fd >= 0:
                select.select([fd], [], [], min(left, 0.5))  # readable once it exits
            else:
                time.sleep(min(left, 0.02))
        return True
    finally:
        if fd >= 0:
            os.close(fd)


def cmd_down(args: argparse.Namespace) -> int:
    path = Path(args.state_file)
    if not path.exists():
        raise NotFoundError(f"no instance {state.instance_name(path)!r}: no state file {path}")
    instance = state.read_instance(path)
    pid = instance.launcher.pid
    if not instance.alive:
        state.remove_if_written_by(path, pid)
        print(
            f"cmemu: instance {instance.name!r} was not running (launcher pid {pid} is gone); "
            f"removed its stale state file {path}"
        )
        return 0
    os.kill(pid, signal.SIGTERM)
    if not wait_exit(pid, args.timeout):
        raise UnavailableError(
            f"instance {instance.name!r} (pid {pid}) still running {args.timeout:g} s after "
            f"SIGTERM; `kill -KILL {pid}` stops it for good"
        )
    if state.remove_if_written_by(path, pid):  # it died without removing its own
        print(f"cmemu: launcher pid {pid} left its state file behind; removed {path}")
    print(f"cmemu: instance {instance.name!r} (pid {pid}) stopped")
    return 0


def down_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=argtypes.seconds,
        default=DOWN_TIMEOUT_S,
        help=f"how long to wait for it to stop after SIGTERM (default {DOWN_TIMEOUT_S:g})",
    )


def cmd_instances(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for path in state.instances():
        try:
            instance = state.read_instance(path)
        except (EmulatorError, OSError, ValueError) as exc:  # listed broken, not fatal
            rows.append({"name": state.instance_name(path), "state": f"unreadable: {exc}"})
            continue
        rows.append(
            {
                "name": instance.name,
                "state": "running" if instance.alive else "stale",
                "pid": instance.launcher.pid,
                "mode": instance.launcher.mode,
                "preset": instance.topology.preset,
                "state_file": str(path),
            }
        )
    print_rows(
        rows,
        [
            ("name", "NAME", "<20"),
            ("state", "STATE", "<8"),
            ("pid", "PID", ">8"),
            ("preset", "PRESET", "<8"),
            ("mode", "MODE", ""),
        ],
        as_json=args.json,
    )
    return 0


def instances_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON array")
