"""`cmemu fault add|ls|rm|kinds`: parsing and printing over emulator/client/faults.py, where the
kinds are registered with their typed parameters and the faults are added, listed and cleared.

`--param k=v` (repeatable) gives a kind's parameters, checked by the kind itself; the older
options (--factor, --latency-us, --side-a/--side-b, --reason) still work and become params.
`--for S` is emulated seconds: the fault's owner (the device's process, the fabric) clears it
itself, so the command returns at once. Process faults have no owner but this command: with
--for it keeps running that long and clears the pause itself.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cmemu.emulator.cli.argtypes import UsageError, choice_of, seconds
from cmemu.emulator.cli.output import Column, print_rows
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.faults import (
    KINDS,
    ActiveFault,
    inject,
    list_all,
    remove,
    remove_all,
)
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults.params import describe
from cmemu.emulator.runtime import state

WAITS_HERE = frozenset(  # no owner clears these in emulated time: this command does
    {"process-pause", "container-kill", "container-pause", "container-stop",
     "container-disconnect", "container-netem"}
)  # fmt: skip  # kinds whose duration this command keeps
OPTION_OF = {  # the older options that still set a parameter
    "factor": "--factor",
    "latency_us": "--latency-us",
    "side_a": "--side-a",
    "side_b": "--side-b",
    "reason": "--reason",
}

# --- the command -------------------------------------------------------------------------------


FAULT_COLUMNS: list[Column] = [
    ("id", "ID", "<24"),
    ("kind", "KIND", "<14"),
    ("target", "TARGET", "<30"),
    ("detail", "DETAIL", ""),
]


def print_faults(faults: list[ActiveFault], as_json: bool) -> None:
    if not faults and not as_json:
        print("no active faults")
        return
    print_rows([asdict(f) for f in faults], FAULT_COLUMNS, as_json=as_json)


async def _with_clients(path: Path, call: Callable[[Clients], Awaitable[Any]]) -> Any:
    """`call` with clients of the instance of state file `path` (its token, CA and, in procs
    mode, its process table too)."""
    clients = await asyncio.to_thread(state.fault_clients, path)
    try:
        return await call(clients)
    finally:
        await clients.close()


def parse_params(pairs: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--param takes KEY=VALUE, got {pair!r}")
        if key in params:
            raise UsageError(f"--param {key} given twice")
        params[key] = value
    return params


def _legacy(args: argparse.Namespace) -> dict[str, str]:
    """The older per-kind options, as params."""
    out: dict[str, str] = {}
    if args.factor is not None:
        out["factor"] = str(args.factor)
    if args.latency_us is not None:
        out["latency_us"] = str(args.latency_us)
    if args.side_a or args.side_b:
        out["side_a"] = ",".join(args.side_a or ())
        out["side_b"] = ",".join(args.side_b or ())
    if args.reason is not None:
        out["reason"] = args.reason
    return out


async def _add(clients: Clients, args: argparse.Namespace, params: dict[str, str]) -> None:
    waits = args.kind in WAITS_HERE and args.for_seconds is not None
    duration = None if waits else args.for_seconds
    fault = await inject(clients, args.kind, args.target or "", params, duration)
    print(f"fault {fault.id}: {fault.kind} {fault.target} {fault.detail}".rstrip(), flush=True)
    if fault.until_ns:
        print(f"it clears itself at {fault.until_ns / 1e9:.3f} s emulated", flush=True)
    if not waits:
        return
    wall = args.for_seconds / clients.topology.time_scale
    print(
        f"clearing it after {args.for_seconds:g} emulated s ({wall:g} s wall); Ctrl-C clears it now"
    )
    try:
        await asyncio.sleep(wall)
    finally:
        await remove(clients, fault.id)
        print(f"fault {fault.id} cleared", flush=True)


def _add_cmd(args: argparse.Namespace) -> int:
    params = {**_legacy(args), **parse_params(args.param or [])}
    kind = KINDS[args.kind]
    try:
        kind.params_from(params)  # a bad parameter fails here, before any instance is asked
    except InvalidArgumentError as exc:
        name = (exc.field or "").removeprefix("params.")
        option = f" or {OPTION_OF[name]}" if name in OPTION_OF else ""
        raise UsageError(f"{exc} (give it as --param {name}=VALUE{option})") from None
    if not args.target and kind.target != "none" and args.kind != "partition":
        raise UsageError(f"fault kind {args.kind} needs TARGET: {kind.target}")
    path = state.path_from(args.state_file)
    asyncio.run(_with_clients(path, lambda c: _add(c, args, params)))
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


def kinds_rows() -> list[dict[str, Any]]:
    return [
        {
            "kind": k.name,
            "target": k.target,
            "help": k.help,
            "params": [
                {"name": n, "type": t, "default": d, "required": d is None, "help": h}
                for n, t, d, h in describe(k.params)
            ],
        }
        for k in KINDS.values()
    ]


def _kinds(args: argparse.Namespace) -> int:
    rows = kinds_rows()
    if args.json:
        print_rows(rows, [], as_json=True)
        return 0
    for row in rows:
        print(f"{row['kind']:<15} {row['help']}")
        print(f"{'':<15} TARGET: {row['target']}")
        for p in row["params"]:
            default = "required" if p["required"] else f"default {p['default']}"
            print(f"{'':<15} --param {p['name']}=<{p['type']}> ({default}): {p['help']}")
    return 0


ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "add": _add_cmd,
    "ls": _ls,
    "rm": _rm,
    "kinds": _kinds,
}


def cmd_fault(args: argparse.Namespace) -> int:
    return ACTIONS[args.action](args)


def fault_args(
    p: argparse.ArgumentParser, add_state: Callable[[argparse.ArgumentParser], None]
) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    kinds = "\n".join(f"  {k.name:<15} {k.help}" for k in KINDS.values())
    add_p = sub.add_parser(
        "add",
        help="inject a fault",
        description=f"Inject a fault (`cmemu fault kinds` lists their params). Kinds:\n{kinds}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_p.add_argument("kind", type=choice_of("fault kind", lambda: list(KINDS)), help="KIND")
    add_p.add_argument(
        "target",
        nargs="?",
        help="a device id (clock-skew: the clock of its process), a node (node-power-off), "
        "a rack (rack-power-off), a link 'a~b' "
        "(cmemu links), a switch id, a process (process-*); none for a partition or a broker "
        "outage",
    )
    add_p.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="a parameter of the kind (repeatable); see `cmemu fault kinds`",
    )
    add_p.add_argument("--factor", type=float, help="link-degraded: --param factor=")
    add_p.add_argument("--latency-us", type=float, help="link-latency: --param latency_us=")
    add_p.add_argument("--side-a", nargs="+", metavar="DEVICE", help="partition: one side")
    add_p.add_argument("--side-b", nargs="+", metavar="DEVICE", help="partition: the other")
    add_p.add_argument("--reason", help="device-down: the reason shown")
    add_p.add_argument(
        "--for",
        dest="for_seconds",
        type=seconds,
        metavar="DURATION",
        help="clear the fault after DURATION of emulated time (30s, 500ms, 1h; a plain number "
        "is seconds); the device's process or the "
        "fabric clears it, so this returns at once (a process pause: this command waits "
        "DURATION / time_scale and clears it). Without --for the fault stays until "
        "`cmemu fault rm`.",
    )
    ls_p = sub.add_parser("ls", help="the active faults, fabric, devices and processes")
    ls_p.add_argument("--json", action="store_true", help="one JSON array")
    rm_p = sub.add_parser("rm", help="clear one fault, or all of them")
    rm_p.add_argument("id", nargs="?", metavar="ID", help="as `cmemu fault ls` shows it")
    rm_p.add_argument("--all", action="store_true", help="every fabric and device fault")
    kinds_p = sub.add_parser("kinds", help="every fault kind, its target and parameters")
    kinds_p.add_argument("--json", action="store_true", help="one JSON array")
    for action in (add_p, ls_p, rm_p):
        add_state(action)
