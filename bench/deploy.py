"""Deployment benchmark, in one run:

1. cm384 in process mode, one process per node (48 nodes and the fabric): wall time from
   starting (`cmemu up --mode procs --per node`, through the launch API) to all-SERVING, and the
   total PSS of all its processes.
   Targets (issue 18): 10 s and 1.5 GB.
2. cm-mini in process mode, one process per device (26 devices and the fabric): time to
   all-SERVING. Runs 1 and 2 then count their idle CPU (every process, % of a core, --idle s).
3. cm-mini from its committed compose file run as processes (`cmemu up --from-compose
   compose/cm-mini.yaml`, its broker the file's mosquitto): time to all-SERVING and the CPU
   seconds all its processes spent by then (its `cmemu` commands forked like process mode's
   unless $CMEMU_FORK=0; mosquitto exec'd).
4. MQTT events per second delivered end to end (an EventBus publishing at QoS 1, through the
   broker, to a subscriber), through the embedded broker and through mosquitto; and from the
   process that serves the embedded broker, which hands it its events with no MQTT connection.

    python bench/deploy.py [--events 20000]
    CMEMU_FORK=0 python bench/deploy.py   # each process exec'd, not forked from the fork server
    python bench/deploy.py --preset cm-mini --events 200 --results /tmp/r   # the quickest

Process mode forks its processes from a fork server (emulator/runtime/forkserver.py) unless
$CMEMU_FORK=0; the path taken is printed (launch_path) and written to the JSON (`launch`).
`--preset` and `--device-preset` choose the presets of runs 1 and 2. Writes
bench/results/deploy.json and deploy.png (start time and PSS per mode, MQTT events/s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiomqtt

from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.events import EventBus
from cmemu.emulator.runtime.launchmodes import Compose, Procs
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.serve import Per
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import free_port_block

try:
    from bench import outputs, progress
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]
    import progress  # type: ignore[import-not-found, no-redef]

COMPOSE_FILE = Path(__file__).resolve().parents[1] / "compose" / "cm-mini.yaml"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
IDLE_SETTLE_S = 3.0  # after all-SERVING, before the idle CPU is counted (the boot's tail)
# (seconds to all-SERVING, total PSS in bytes) the issue asks of one process per node
TARGETS: dict[str, tuple[float, float]] = {"cm384": (10.0, 1.5 * 2**30)}


def pss_mb(root: int) -> float:
    """PSS of a process and all its descendants (shared pages split fairly among them)."""
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(root)], capture_output=True, text=True, check=False
    ).stdout.split()
    total = 0.0
    try:
        rollup = Path(f"/proc/{root}/smaps_rollup").read_text()
    except FileNotFoundError:  # it exited meanwhile (the `ps` just run is a child too)
        return 0.0
    for line in rollup.splitlines():
        if line.startswith("Pss:"):
            total += int(line.split()[1]) / 1024
    return total + sum(pss_mb(int(c)) for c in children)


async def idle_cpu(idle_s: float) -> float:
    """Percent of a core every process of this tree (the launcher's, this one, included) spends
    over `idle_s` wall seconds with nothing asked of it, after as long again (at most
    IDLE_SETTLE_S) to settle."""
    await asyncio.sleep(min(idle_s, IDLE_SETTLE_S))
    before, started = cpu_s(os.getpid()), time.perf_counter()
    await asyncio.sleep(idle_s)
    return 100 * (cpu_s(os.getpid()) - before) / (time.perf_counter() - started)


async def boot(preset: str, per: Per, idle_s: float) -> dict[str, Any]:
    """Seconds to all-SERVING, total PSS and processes of one process-mode supernode, started
    through the typed launch API exactly as `cmemu up --mode procs` starts it; then its idle
    CPU over `idle_s` (0: not measured)."""
    options = LaunchOptions(preset=preset, mode=Procs(per=per), broker=NO_BROKER)
    started = time.perf_counter()
    async with Supernode.start(options) as sn:
        seconds = time.perf_counter() - started
        assert sn.supervisor is not None
        server = sn.supervisor.fork_server
        serve = [pss_mb(r.proc.pid) for r in sn.supervisor.running.values()]
        idle = await idle_cpu(idle_s) if idle_s > 0 else None
        return {
            "idle_cpu_percent": idle,
            "preset": preset,
            "per": per,
            "launch": sn.supervisor.launch_path,  # "fork server", or "exec" ($CMEMU_FORK=0)
            "boot_s": seconds,
            "pss_bytes": pss_mb(os.getpid()) * 2**20,
            "processes": 1 + len(sn.supervisor.running) + (server is not None),
            "serve_pss_mb_median": statistics.median(serve),
            "fork_server_pss_mb": pss_mb(server.proc.pid) if server is not None else 0.0,
        }


def cpu_s(pid: int) -> float:
    """CPU seconds of a process and its descendants, reaped ones included (/proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    own = sum(int(f) for f in fields[11:15]) / CLOCK_TICK  # utime stime cutime cstime
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    return own + sum(cpu_s(int(c)) for c in children)


async def from_compose() -> dict[str, Any]:
    """Seconds to all-SERVING and CPU seconds of every process by then, of cm-mini's compose
    file run as processes, through the typed launch API as `cmemu up --from-compose` runs it."""
    with tempfile.TemporaryDirectory() as tmp:
        options = LaunchOptions(mode=Compose(file=COMPOSE_FILE, run_dir=Path(tmp) / "run"))
        before = cpu_s(os.getpid())
        started = time.perf_counter()
        async with Supernode.start(options) as sn:
            seconds = time.perf_counter() - started
            assert sn.supervisor is not None
            return {
                "preset": "cm-mini",
                "per": "compose service",
                "launch": sn.supervisor.launch_path,
                "boot_s": seconds,
                "cpu_s": cpu_s(os.getpid()) - before,
                "pss_bytes": pss_mb(os.getpid()) * 2**20,
                "processes": 1
                + len(sn.supervisor.running)
                + (sn.supervisor.fork_server is not None),
            }


async def events_per_second(url: str, count: int) -> float:
    host, port = url.removeprefix("mqtt://").split(":")
    received = 0
    async with aiomqtt.Client(host, int(port)) as sub:
        await sub.subscribe("cmemu/bench/+/events", qos=1)

        async def consume() -> None:
            nonlocal received
            async for _ in sub.messages:
                received += 1
                if received == count:
                    return

        async with asyncio.TaskGroup() as tasks, EventBus(url, "bench", buffer_max=count) as bus:
            consumer = tasks.create_task(consume(), name="consumer")
            started = time.perf_counter()
            for i in range(count):
                bus.event(f"n{i % 48:02d}-npu{i % 8}", "health", i, status="SERVING")
            async with asyncio.timeout(120):
                await consumer
            elapsed = time.perf_counter() - started
    return count / elapsed


async def mqtt(count: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    async with Broker() as broker:
        # a publisher in another process reaches it over MQTT (here: under another URL than
        # its own, so this process's publisher does too); one in its process hands it over
        rates["embedded"] = await events_per_second(f"mqtt://localhost:{broker.port}", count)
        rates["embedded_in_process"] = await events_per_second(broker.url, count)
    print(
        f"mqtt_events_per_s      embedded broker {rates['embedded']:,.0f}  "
        f"({count:,} QoS 1 events, end to end; from its own process "
        f"{rates['embedded_in_process']:,.0f})"
    )
    mosquitto = shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")
    if mosquitto is None:
        print("mqtt_events_per_s      mosquitto       skipped: not installed")
        return rates
    port = free_port_block(1, start=31000)
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "m.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n")
        proc = await asyncio.create_subprocess_exec(
            mosquitto, "-c", str(conf), stderr=asyncio.subprocess.DEVNULL
        )
        try:
            await asyncio.sleep(0.5)
            rates["mosquitto"] = await events_per_second(f"mqtt://127.0.0.1:{port}", count)
        finally:
            proc.terminate()
            await proc.wait()
    print(f"mqtt_events_per_s      mosquitto       {rates['mosquitto']:,.0f}")
    return rates


def plot(doc: dict[str, Any], directory: Path) -> None:
    modes = doc["modes"]
    labels = [
        f"{m['preset']}, a process per {m['per']}\n({m['processes']} processes)" for m in modes
    ]
    target = TARGETS.get(modes[0]["preset"])
    with outputs.figure(
        directory, "deploy", ncols=3, title="process mode (cmemu up --mode procs) and MQTT events"
    ) as (start, pss, mqtt_ax):  # fmt: skip
        outputs.bars(
            start,
            labels,
            {"start to all-SERVING": [m["boot_s"] for m in modes]},
            targets={f"target per node ({target[0]:g} s)": target[0]} if target else None,
            ylabel="seconds",
            title="start time",
        )
        outputs.bars(
            pss,
            labels,
            {"PSS of every process": [m["pss_bytes"] / 2**20 for m in modes]},
            targets={f"target per node ({target[1] / 2**20:,.0f} MiB)": target[1] / 2**20}
            if target
            else None,
            ylabel="MiB (proportional set size)",
            title="memory",
            value_format="%.0f",
        )
        for ax in (start, pss):
            ax.tick_params(axis="x", labelsize=8)
        brokers = doc["mqtt_events_per_s"]
        outputs.bars(
            mqtt_ax,
            list(brokers),
            {"events/s": list(brokers.values())},
            ylabel="QoS 1 events per second, end to end",
            title=f"MQTT: {doc['events']:,} events through a broker",
            value_format="%.0f",
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--preset", default="cm384", help="run 1: a process per node")
    parser.add_argument("--device-preset", default="cm-mini", help="run 2: a process per device")
    parser.add_argument(
        "--idle", type=float, default=10.0, help="wall s of idle CPU counted in runs 1-2 (0: none)"
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.events < 1:
        parser.error("--events must be at least 1")
    if args.idle < 0:
        parser.error("--idle must be at least 0")
    configure_logging("warning")
    with progress.steps("deployment modes", total=4) as advance:
        per_node = asyncio.run(boot(args.preset, "node", args.idle))
        advance(1)
        per_device = asyncio.run(boot(args.device_preset, "device", args.idle))
        advance(1)
        compose = asyncio.run(from_compose())
        advance(1)
        rates = asyncio.run(mqtt(args.events))
        advance(1)
    target = TARGETS.get(args.preset)
    wanted = f"; target {target[0]:g}" if target else ""
    print(f"launch_path            {per_node['launch']}  ($CMEMU_FORK=0: exec)")
    print(
        f"{args.preset}_per_node_boot_s  {per_node['boot_s']:.1f}  "
        f"({per_node['processes']} processes{wanted})"
    )
    wanted = f"  (target {target[1] / 2**20:,.0f})" if target else ""
    print(
        f"{args.preset}_per_node_pss_mb  {per_node['pss_bytes'] / 2**20:,.0f}{wanted}  (a serve "
        f"process's median {per_node['serve_pss_mb_median']:.1f}, the fork server "
        f"{per_node['fork_server_pss_mb']:.1f})"
    )
    print(
        f"{args.device_preset}_per_device_boot_s {per_device['boot_s']:.1f}  "
        f"({per_device['processes']} processes, {per_device['pss_bytes'] / 2**20:,.0f} MB PSS, "
        f"a serve process's median {per_device['serve_pss_mb_median']:.1f})"
    )
    for run in (per_node, per_device):
        if run["idle_cpu_percent"] is not None:
            print(
                f"{run['preset']}_per_{run['per']}_idle_cpu  {run['idle_cpu_percent']:.1f}% of a "
                f"core  ({run['processes']} processes, over {args.idle:g} s after "
                f"{min(args.idle, IDLE_SETTLE_S):g} s to settle)"
            )
    print(
        f"cm-mini_from_compose_boot_s {compose['boot_s']:.1f}  ({compose['processes']} processes, "
        f"{compose['cpu_s']:.1f} CPU s by then, {compose['pss_bytes'] / 2**20:,.0f} MB PSS)"
    )
    doc = {
        "launch": per_node["launch"],
        "modes": [per_node, per_device, compose],
        "targets": {p: {"boot_s": t[0], "pss_bytes": t[1]} for p, t in TARGETS.items()},
        "events": args.events,
        "mqtt_events_per_s": rates,
    }
    outputs.write_json(args.results, "deploy", doc)
    plot(doc, args.results)
    outputs.announce(args.results, "deploy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
