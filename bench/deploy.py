"""Deployment benchmark, in one run:

1. cm384 in process mode, one process per node (48 nodes and the fabric): wall time from
   starting (`cmemu up --mode procs --per node`, through the launch API) to all-SERVING, and the
   total PSS of all its processes.
   Targets: 30 s and 4 GB.
2. cm-mini in process mode, one process per device (26 devices and the fabric): time to
   all-SERVING.
3. MQTT events per second delivered end to end (an EventBus publishing at QoS 1, through the
   broker, to a subscriber), through the embedded broker and through mosquitto.

    python bench/deploy.py [--events 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiomqtt

from emulator.runtime.broker import Broker
from emulator.runtime.events import EventBus
from emulator.runtime.logs import configure_logging
from emulator.runtime.serve import Per
from emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from emulator.testing import free_port_block


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


async def boot(preset: str, per: Per) -> tuple[float, float, int]:
    """(seconds to all-SERVING, total PSS in MB, processes) of one process-mode supernode,
    started through the typed launch API exactly as `cmemu up --mode procs` starts it."""
    options = LaunchOptions(preset=preset, mode="procs", per=per, broker=NO_BROKER)
    started = time.perf_counter()
    async with Supernode.start(options) as sn:
        seconds = time.perf_counter() - started
        assert sn.supervisor is not None
        return seconds, pss_mb(os.getpid()), 1 + len(sn.supervisor.running)


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


async def mqtt(count: int) -> None:
    async with Broker() as broker:
        rate = await events_per_second(broker.url, count)
    print(
        f"mqtt_events_per_s      embedded broker {rate:,.0f}  ({count:,} QoS 1 events, end to end)"
    )
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port_block(1, start=31000)
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "m.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n")
        proc = await asyncio.create_subprocess_exec(
            mosquitto, "-c", str(conf), stderr=asyncio.subprocess.DEVNULL
        )
        try:
            await asyncio.sleep(0.5)
            rate = await events_per_second(f"mqtt://127.0.0.1:{port}", count)
        finally:
            proc.terminate()
            await proc.wait()
    print(f"mqtt_events_per_s      mosquitto       {rate:,.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    configure_logging("warning")
    seconds, pss, procs = asyncio.run(boot("cm384", "node"))
    print(f"cm384_per_node_boot_s  {seconds:.1f}  ({procs} processes; target 30)")
    print(f"cm384_per_node_pss_mb  {pss:,.0f}  (target 4,096)")
    seconds, pss, procs = asyncio.run(boot("cm-mini", "device"))
    print(f"mini_per_device_boot_s {seconds:.1f}  ({procs} processes, {pss:,.0f} MB PSS)")
    asyncio.run(mqtt(args.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
