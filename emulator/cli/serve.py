"""`cmemu serve`: one container's (or one process's) part of a topology, until SIGTERM; and the
signal handling every long-running command shares. It imports only what serving needs: a
container runs this in every one of hundreds of processes."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from cmemu.emulator.cli import argtypes
from cmemu.emulator.runtime.security import Security
from cmemu.emulator.runtime.serve import (
    DEFAULT_CLOCK_WAIT_S,
    DEFAULT_REBUILD_WAIT_S,
    DEFAULT_SERVE_DRAIN_S,
    SERVE_KINDS,
    ServeOptions,
    serve,
)
from cmemu.emulator.runtime.taskdump import print_tasks


def stop_event() -> asyncio.Event:
    """Set by SIGINT or SIGTERM: the launcher turns every server NOT_SERVING, drains, stops."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # `kill -USR1 PID`: what every task waits in, on stderr (a stuck call, a stuck stop)
    loop.add_signal_handler(signal.SIGUSR1, print_tasks, "on SIGUSR1")
    loop.set_exception_handler(_cancelled_is_quiet)
    return stop


def _cancelled_is_quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A callback that raised CancelledError was cancelled, nothing went wrong (aiomqtt's
    disconnect callback reads its connect future, cancelled by a stop during the connect, and
    raises it): not a traceback on stderr. Everything else as asyncio reports it."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


# --- serve ----------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    kind = next(k for k in SERVE_KINDS if getattr(args, k))
    options = ServeOptions(
        topology_path=Path(args.topology),
        kind=kind,
        name=getattr(args, kind),
        drain_s=args.drain,
        ssd_dir=Path(args.ssd_dir) if args.ssd_dir else None,
        rebuild_wait_s=args.rebuild_wait,
        clock_wait_s=args.clock_wait,
        security=Security.from_env(os.environ, insecure=args.insecure),
    )

    async def run() -> None:
        await serve(options, stop_event())

    asyncio.run(run())
    return 0


def serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, help="the topology document (JSON)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--device", help="one device id")
    what.add_argument("--node", help="every device of one node, e.g. n07")
    what.add_argument("--service", help="a supernode-wide service, e.g. fabric")
    p.add_argument(
        "--drain",
        type=argtypes.non_negative_seconds,
        default=DEFAULT_SERVE_DRAIN_S,
        help=f"seconds between NOT_SERVING and stop (default {DEFAULT_SERVE_DRAIN_S:g})",
    )
    p.add_argument(
        "--clock-wait",
        type=argtypes.seconds,
        default=DEFAULT_CLOCK_WAIT_S,
        help="without an epoch in the topology or $CMEMU_EPOCH: seconds to keep asking the "
        f"fabric for its clock before giving up (default {DEFAULT_CLOCK_WAIT_S:g})",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow binding beyond loopback without a token ($CMEMU_INSECURE=1 too); the "
        "token comes from $CMEMU_TOKEN_FILE, TLS from $CMEMU_TLS_CERT, _KEY and _CA",
    )
    p.add_argument(
        "--ssd-dir", help="with --service ems: where its SSD tier lives (default $CMEMU_EMS_SSD)"
    )
    p.add_argument(
        "--rebuild-wait",
        type=argtypes.non_negative_seconds,
        default=DEFAULT_REBUILD_WAIT_S,
        help="with --service ems: seconds to wait for silent memory pools while rebuilding the "
        f"index before counting them down (default {DEFAULT_REBUILD_WAIT_S:g})",
    )
