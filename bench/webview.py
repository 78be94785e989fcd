"""What the web view costs the emulator, and how fast a fault reaches the page.

For each preset, `cmemu up` runs twice, with `--ui none` and with the web view; after a settling
pause, the launcher's CPU time (user + system, /proc) over `--seconds` of idle wall time gives
its CPU share with and without the view. With the view, `--faults` device faults are added and
cleared through the typed client (as `cmemu fault` does), and the wall time from the fault's RPC
returning to the `diff` that carries it on the page's stream (`/events`) is measured. Writes
bench/results/webview.json and webview.png.

    python bench/webview.py [--presets cm-mini cm384] [--seconds 20] [--faults 10]
    python bench/webview.py --presets cm-mini --seconds 1 --faults 1 --settle 1   # the quickest
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from cmemu.emulator.client import faults
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.naming import DeviceKind
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.runtime import state
from cmemu.emulator.testing import cmemu_up, free_port_block, next_sse_event

if TYPE_CHECKING:
    from matplotlib.axes import Axes

try:
    from bench import outputs, progress
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]
    import progress  # type: ignore[import-not-found, no-redef]

SETTLE_S = 8.0  # the view's first sweeps (telemetry, links, planes) before measuring


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _until(response: aiohttp.ClientResponse, device: str, health: str) -> float:
    while True:
        _, data = await asyncio.wait_for(next_sse_event(response), 30)
        if data.get("devices", {}).get(device, {}).get("health") == health:
            return time.perf_counter()


async def fault_latencies(path: Path, count: int) -> list[float]:
    """Seconds from each device fault's RPC returning to its diff on /events."""
    instance = state.read_instance(path)
    assert instance.launcher.ui is not None
    clients = Clients(instance.topology)
    npus = [d.id for d in instance.topology.devices if d.kind is DeviceKind.NPU]
    out: list[float] = []
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(instance.launcher.ui + "events") as response,
        ):
            await next_sse_event(response)  # the snapshot
            for i in progress.track(range(count), "faults to the page"):
                device = npus[(i * 37) % len(npus)]
                await faults.inject(clients, "device-down", device)
                done = time.perf_counter()
                out.append(await _until(response, device, "NOT_SERVING") - done)
                await faults.remove(clients, faults.device_fault_id(device))
                await _until(response, device, "SERVING")
    finally:
        await clients.close()
    return out


def one(preset: str, ui: bool, seconds: float, count: int, settle_s: float) -> dict[str, Any]:
    base = free_port_block(server_count(build(preset)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        args = ("--preset", preset, "--base-port", str(base), *(() if ui else ("--ui", "none")))
        with cmemu_up(path, *args, quiet=True, timeout_s=300) as proc:
            time.sleep(settle_s)
            before, started = cpu_seconds(proc.pid), time.perf_counter()
            time.sleep(seconds)
            share = (cpu_seconds(proc.pid) - before) / (time.perf_counter() - started)
            latencies = asyncio.run(fault_latencies(path, count)) if ui else []
    return {"preset": preset, "ui": ui, "cpu_share": share, "fault_to_page_s": latencies}


def plot(rows: list[dict[str, Any]], directory: Path) -> None:
    presets = list(dict.fromkeys(r["preset"] for r in rows))

    def share(preset: str, ui: bool) -> float:
        return 100 * float(
            next(r["cpu_share"] for r in rows if r["preset"] == preset and r["ui"] is ui)
        )

    with outputs.figure(directory, "webview", ncols=2, size=(10, 4)) as (cpu, lat):
        outputs.bars(
            cpu,
            presets,
            {
                "--ui none": [share(p, False) for p in presets],
                "web view": [share(p, True) for p in presets],
            },
            ylabel="launcher CPU, idle (% of one core)",
            title="cost of the web view",
            value_format="%.1f",
        )
        _latencies(lat, rows)


def _latencies(lat: Axes, rows: list[dict[str, Any]]) -> None:
    """Spread of the fault-to-page times per preset, against the issue's bound."""
    data = [[1e3 * x for x in r["fault_to_page_s"]] for r in rows if r["ui"]]
    lat.boxplot(data, tick_labels=[r["preset"] for r in rows if r["ui"]])
    lat.axhline(2000, color="tab:red", linestyle="--", label="issue's bound: 2 s")
    lat.set_ylabel("fault RPC done to /events diff (ms)")
    lat.set_yscale("log")
    lat.legend()
    lat.set_title("a device fault reaching the page")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=["cm-mini", "cm384"])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument(
        "--settle", type=float, default=SETTLE_S, help="seconds after boot before measuring"
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.seconds <= 0 or args.faults < 1 or args.settle < 0:
        parser.error("--seconds and --faults must be positive, --settle not negative")
    runs = [(preset, ui) for preset in args.presets for ui in (False, True)]
    rows = [
        one(preset, ui, args.seconds, args.faults, args.settle)
        for preset, ui in progress.track(runs, "cmemu up with and without the view")
    ]
    for r in rows:
        line = f"{r['preset']:<8} {'web view' if r['ui'] else '--ui none':<10} "
        line += f"launcher CPU idle {100 * r['cpu_share']:5.1f}% of a core"
        if r["fault_to_page_s"]:
            ms = [1e3 * x for x in r["fault_to_page_s"]]
            line += (
                f"; fault to page median {statistics.median(ms):.0f} ms, "
                f"max {max(ms):.0f} ms ({len(ms)} faults)"
            )
        print(line, flush=True)
    outputs.write_json(args.results, "webview", {"seconds": args.seconds, "runs": rows})
    plot(rows, args.results)
    outputs.announce(args.results, "webview")
    return 0


if __name__ == "__main__":
    sys.exit(main())
