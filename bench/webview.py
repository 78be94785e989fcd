"""What the web view costs the emulator, and how fast a fault reaches the page.

For each preset, `cmemu up` runs twice, with `--ui none` and with the web view; after a settling
pause, the launcher's CPU time (user + system, /proc) over `--seconds` of idle wall time gives
its CPU share with and without the view. With the view, `--faults` device faults are added and
cleared through the typed client (as `cmemu fault` does), and the wall time from the fault's RPC
returning to the `diff` that carries it on the page's stream (`/events`) is measured. Writes
bench/results/webview.json and webview.png.

    python bench/webview.py [--presets cm-mini cm384] [--seconds 20] [--faults 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from emulator.client import faults
from emulator.client.clients import Clients
from emulator.model.naming import DeviceKind
from emulator.model.topology import build, server_count
from emulator.runtime import state
from emulator.testing import cmemu_up, free_port_block

try:
    from bench import progress
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import progress  # type: ignore[import-not-found, no-redef]

RESULTS = Path(__file__).parent / "results"
SETTLE_S = 8.0  # the view's first sweeps (telemetry, links, planes) before measuring


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _next_event(response: aiohttp.ClientResponse) -> tuple[str, dict[str, Any]]:
    event, data = "message", ""
    while True:
        line = (await response.content.readline()).decode().rstrip("\n")
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data += line.removeprefix("data: ")
        elif not line and data:
            return event, json.loads(data)


async def _until(response: aiohttp.ClientResponse, device: str, health: str) -> float:
    while True:
        _, data = await asyncio.wait_for(_next_event(response), 30)
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
            await _next_event(response)  # the snapshot
            for i in progress.track(range(count), "faults to the page"):
                device = npus[(i * 37) % len(npus)]
                await faults.add(clients, "device-down", faults.FaultOptions(target=device))
                done = time.perf_counter()
                out.append(await _until(response, device, "NOT_SERVING") - done)
                await faults.remove(clients, faults.device_fault_id(device))
                await _until(response, device, "SERVING")
    finally:
        await clients.close()
    return out


def one(preset: str, ui: bool, seconds: float, count: int) -> dict[str, Any]:
    base = free_port_block(server_count(build(preset)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        args = ("--preset", preset, "--base-port", str(base), *(() if ui else ("--ui", "none")))
        with cmemu_up(path, *args, quiet=True, timeout_s=300) as proc:
            time.sleep(SETTLE_S)
            before, started = cpu_seconds(proc.pid), time.perf_counter()
            time.sleep(seconds)
            share = (cpu_seconds(proc.pid) - before) / (time.perf_counter() - started)
            latencies = asyncio.run(fault_latencies(path, count)) if ui else []
    return {"preset": preset, "ui": ui, "cpu_share": share, "fault_to_page_s": latencies}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r["preset"] for r in rows))
    fig, (cpu, lat) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for k, ui in enumerate((False, True)):
        values = [
            100 * next(r["cpu_share"] for r in rows if r["preset"] == p and r["ui"] is ui)
            for p in presets
        ]
        xs = [i + (k - 0.5) * width for i in range(len(presets))]
        cpu.bar(xs, values, width, label="web view" if ui else "--ui none")
    cpu.set_xticks(range(len(presets)), presets)
    cpu.set_ylabel("launcher CPU, idle (% of one core)")
    cpu.legend()
    cpu.set_title("cost of the web view")
    data = [[1e3 * x for x in r["fault_to_page_s"]] for r in rows if r["ui"]]
    lat.boxplot(data, tick_labels=[r["preset"] for r in rows if r["ui"]])
    lat.axhline(2000, color="tab:red", linestyle="--", label="issue's bound: 2 s")
    lat.set_ylabel("fault RPC done to /events diff (ms)")
    lat.set_yscale("log")
    lat.legend()
    lat.set_title("a device fault reaching the page")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=["cm-mini", "cm384"])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--faults", type=int, default=10)
    args = parser.parse_args()
    rows = [
        one(preset, ui, args.seconds, args.faults)
        for preset in args.presets
        for ui in (False, True)
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
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "webview.json").write_text(json.dumps({"seconds": args.seconds, "runs": rows}))
    plot(rows, RESULTS / "webview.png")
    print(f"wrote {RESULTS / 'webview.json'} and {RESULTS / 'webview.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
