"""`cmemu fault add|ls|rm`: parsing and printing over emulator/client/faults.py, where the
kinds are registered and the faults are added, listed and cleared. `--for` is the CLI's own: it
keeps the command running and clears the fault itself."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from emulator.cli.argtypes import UsageError, choice_of, positive_float
from emulator.cli.output import Column, print_rows
from emulator.client.clients import Clients
from emulator.client.faults import (
    DEFAULT_REASON,
    KINDS,
    ActiveFault,
    FaultOptions,
    add,
    list_all,
    missing_options,
    remove,
    remove_all,
)
from emulator.runtime import state

# --- the command -------------------------------------------------------------------------------


FAULT_COLUMNS: list[Column] = [
    ("id", "ID", "<20"),
    ("kind", "KIND", "<14"),
    ("target", "TARGET", "<34"),
    ("detail", "DETAIL", ""),
]


def print_faults(faults: list[ActiveFault], as_json: bool) -> None:
    if not faults and not as_json:
        print("no active faults")
        return
    print_rows([asdict(f) for f in faults], FAULT_COLUMNS, as_json=as_json)


async def _with_clients(path: Path, call: Callable[[Clients], Awaitable[Any]]) -> Any:
    """`call` with clients of the instance of state file `path` (its token and CA too)."""
    clients = Clients(state.read(path), state.credentials(path))
    try:
        return await call(clients)
    finally:
        await clients.close()


async def _add_for(clients: Clients, kind: str, opts: FaultOptions, seconds: float | None) -> None:
    fault = await add(clients, kind, opts)
    print(f"fault {fault.id}: {fault.kind} {fault.target} {fault.detail}".rstrip(), flush=True)
    if seconds is None:
        return
    wall = seconds / clients.topology.time_scale
    print(
        f"clearing it after {seconds:g} emulated s ({wall:g} s wall); Ctrl-C clears it now",
        flush=True,
    )
    try:
        await asyncio.sleep(wall)
    finally:
        await remove(clients, fault.id)
        print(f"fault {fault.id} cleared", flush=True)


def _add(args: argparse.Namespace) -> int:
    opts = FaultOptions(
        target=args.target or "",
        factor=args.factor,
        latency_us=args.latency_us,
        side_a=tuple(args.side_a or ()),
        side_b=tuple(args.side_b or ()),
        reason=args.reason,
    )
    missing = missing_options(args.kind, opts)
    if missing:
        raise UsageError(f"fault kind {args.kind} needs {' and '.join(missing)}")
    path = state.path_from(args.state_file)
    asyncio.run(_with_clients(path, lambda c: _add_for(c, args.kind, opts, args.for_seconds)))
    return 0


def _ls(args: argparse.Namespace) -> int:
    path = state.path_from(args.state_file)
    faults = asyncio.run(_with_clients(path, list_all))
    print_faults(faults, args.json)
    return 0


def _rm(args: argparse.Namespace) -> int:
    if bool(args.id) == bool(args.all):
        raise UsageError("give one fault ID (see `cmemu fault ls`) or --all")
    path = state.path_from(args.state_file)
    if args.all:
        cleared = asyncio.run(_with_clients(path, remove_all))
        print(f"cleared {len(cleared)} fault{'s' if len(cleared) != 1 else ''}")
        for f in cleared:
            print(f"  {f.id} {f.kind} {f.target}")
        return 0
    asyncio.run(_with_clients(path, lambda c: remove(c, args.id)))
    print(f"cleared {args.id}")
    return 0


ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {"add": _add, "ls": _ls, "rm": _rm}


def cmd_fault(args: argparse.Namespace) -> int:
    return ACTIONS[args.action](args)


def fault_args(
    p: argparse.ArgumentParser, add_state: Callable[[argparse.ArgumentParser], None]
) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    kinds = "\n".join(f"  {k.name:<14} {k.help}" for k in KINDS.values())
    add_p = sub.add_parser(
        "add",
        help="inject a fault",
        description=f"Inject a fault. Kinds:\n{kinds}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_p.add_argument("kind", type=choice_of("fault kind", lambda: list(KINDS)), help="KIND")
    add_p.add_argument(
        "target",
        nargs="?",
        help="a link 'a~b' (see `cmemu links --json` or `cmemu topology --json`), a switch id, "
        "or a device id (device-down); none for a partition",
    )
    add_p.add_argument("--factor", type=float, help="link-degraded: remaining share, in (0, 1)")
    add_p.add_argument("--latency-us", type=float, help="link-latency: added microseconds")
    add_p.add_argument("--side-a", nargs="+", metavar="DEVICE", help="partition: one side")
    add_p.add_argument("--side-b", nargs="+", metavar="DEVICE", help="partition: the other")
    add_p.add_argument("--reason", default=DEFAULT_REASON, help="device-down: the reason shown")
    add_p.add_argument(
        "--for",
        dest="for_seconds",
        type=positive_float,
        metavar="SECONDS",
        help="clear the fault after SECONDS of emulated time (SECONDS / time_scale of wall "
        "time). Nothing on the server expires it: this command keeps running that long and "
        "clears it itself (Ctrl-C clears it at once). Without --for the fault stays until "
        "`cmemu fault rm`.",
    )
    ls_p = sub.add_parser("ls", help="the active faults, fabric and devices")
    ls_p.add_argument("--json", action="store_true", help="one JSON array")
    rm_p = sub.add_parser("rm", help="clear one fault, or all of them")
    rm_p.add_argument("id", nargs="?", metavar="ID", help="as `cmemu fault ls` shows it")
    rm_p.add_argument("--all", action="store_true", help="every fabric and device fault")
    for action in (add_p, ls_p, rm_p):
        add_state(action)
