"""`cmemu xfer` and `cmemu links`: the live fabric of a running emulator, from the shell.

`cmemu links` prints directed links as naming.py spells them (a>b, data from a to b); each pastes
as is into a link fault (Fabric/InjectFault target), which takes its physical link down."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

from cmemu.emulator.cli import progress
from cmemu.emulator.cli.argtypes import (
    non_negative_int,
    positive_int,
    positive_size,
    seconds,
)
from cmemu.emulator.client.fabric import FabricClient, RouteInfo
from cmemu.emulator.engines.fabric.types import LinkStats
from cmemu.emulator.model.ub import Op
from cmemu.emulator.runtime import state

OPS = {"read": Op.READ, "write": Op.WRITE}


async def _xfer(args: argparse.Namespace) -> dict[str, Any]:
    every = state.clients(args.state_path)
    try:
        done = await FabricClient(every).xfer(
            args.src,
            args.dst,
            args.bytes,
            op=OPS[args.op],
            src_die=args.src_die,
            pacing=(lambda route, scale: _bar(route, scale, args)) if progress.wanted() else None,
        )
    finally:
        await every.close()
    took_s = done.emulated_s
    return {
        "src": done.src,
        "dst": done.dst,
        "op": args.op,
        "bytes": args.bytes,
        "emulated_us": took_s * 1e6,
        "bandwidth_GB_s": done.bandwidth_gb_s,
        "path": list(done.completion.path),
        "planes": done.completion.planes,
        "issue_ns": done.completion.issue_ns,
        "complete_ns": done.completion.complete_ns,
    }


def _bar(
    route: RouteInfo, time_scale: float, args: argparse.Namespace
) -> contextlib.closing[progress.TimedBar]:
    """A terminal's bar for a transfer the fabric paces to emulated time: its expected wall
    time from the route's uncontended bandwidth (shown only if it lasts, see progress.py)."""
    emulated_s = route.latency_ns / 1e9 + args.bytes / max(route.max_gb_s * 1e9, 1.0)
    return contextlib.closing(
        progress.TimedBar(
            f"{args.op} {args.bytes:,} bytes {args.src} -> {args.dst}", emulated_s / time_scale
        )
    )


def cmd_xfer(args: argparse.Namespace) -> int:
    args.state_path = state.path_from(args.state_file)
    result = asyncio.run(_xfer(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['op']} {result['bytes']} bytes {result['src']} -> {result['dst']}: "
        f"{result['emulated_us']:.3f} us emulated, {result['bandwidth_GB_s']:.2f} GB/s, "
        f"{result['planes']} planes"
    )
    print("path " + " -> ".join(result["path"]))
    return 0


def xfer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="issuing device id, e.g. n00-npu0")
    p.add_argument("dst", help="target device id, e.g. n01-mem")
    p.add_argument(
        "--bytes",
        type=positive_size,
        required=True,
        help="bytes to move (size-only payload), e.g. 4096, 1e9, 64KiB, 2GB",
    )
    p.add_argument("--op", choices=sorted(OPS), default="write")
    p.add_argument("--src-die", type=int, default=0, help="the issuing NPU's die (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON object")


async def _links(topology_path: Any, top: int) -> LinkStats:
    clients = state.clients(topology_path)
    try:
        return await FabricClient(clients).link_stats(top)
    finally:
        await clients.close()


def _rows(stats: LinkStats) -> list[dict[str, Any]]:
    return [
        {
            "link": s.link,
            "kind": s.kind,
            "bytes": s.bytes,
            "capacity_GB_s": s.capacity_bytes_per_s / 1e9,
            "utilization": s.utilization,
            "active_flows": s.active_flows,
            "up": s.up,
        }
        for s in stats.links
    ]


def _table(stats: LinkStats) -> list[str]:
    lines = [f"{'LINK':<34} {'KIND':<8} {'BYTES':>14} {'GB/s':>7} {'UTIL':>6} {'FLOWS':>5}  UP"]
    for r in _rows(stats):
        lines.append(
            f"{r['link']:<34} {r['kind']:<8} {r['bytes']:>14} {r['capacity_GB_s']:>7.2f} "
            f"{r['utilization']:>6.1%} {r['active_flows']:>5}  {'yes' if r['up'] else 'NO'}"
        )
    lines.append(f"{stats.active_flows} flows in flight, {stats.completed_flows} completed")
    return lines


CLEAR_SCREEN = "\x1b[H\x1b[2J"


async def _watch_links(args: argparse.Namespace) -> None:
    """Redraw the table on every frame of the fabric's WatchLinkStats stream (top-style on a
    terminal; frames one after another, or JSON lines, otherwise)."""
    clients = state.clients(state.path_from(args.state_file))
    redraw = sys.stdout.isatty() and not args.json
    frames = 0
    watch = FabricClient(clients).watch_link_stats(args.top, args.interval)
    try:
        async for stats in watch:
            frames += 1
            if args.json:
                print(json.dumps({"emulated_ns": stats.emulated_ns, "links": _rows(stats)}))
            else:
                header = (
                    f"cmemu links: {clients.topology.supernode} at {stats.emulated_ns / 1e9:.3f} s "
                    f"emulated, every {args.interval:g} s (Ctrl-C stops)"
                )
                text = "\n".join([header, "", *_table(stats)])
                print((CLEAR_SCREEN if redraw else ("" if frames == 1 else "\n")) + text)
            sys.stdout.flush()
            if args.count and frames >= args.count:
                return
    finally:
        await watch.aclose()  # ends the stream before its channel closes
        await clients.close()


def cmd_links(args: argparse.Namespace) -> int:
    if args.watch:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_watch_links(args))
        return 0
    stats = asyncio.run(_links(state.path_from(args.state_file), args.top))
    if args.json:
        print(json.dumps(_rows(stats), indent=2))
        return 0
    print("\n".join(_table(stats)))
    return 0


def links_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--top", type=positive_int, default=20, help="how many links, busiest first (default 20)"
    )
    p.add_argument("--json", action="store_true", help="one JSON array (--watch: one per frame)")
    p.add_argument(
        "--watch", action="store_true", help="a live view, redrawn every --interval; Ctrl-C stops"
    )
    p.add_argument(
        "--interval",
        type=seconds,
        default=1.0,
        help="with --watch, the time between frames, e.g. 500ms, 2s (default 1 s, at least 10 ms)",
    )
    p.add_argument(
        "--count",
        type=non_negative_int,
        default=0,
        help="with --watch, stop after N frames (0: never)",
    )
