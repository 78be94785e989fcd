"""Deployment benchmark, in one run:

1. cm384 in process mode, one process per node (48 nodes and the fabric): wall time from
   `cmemu up --mode procs --per node` to all-SERVING, and the total PSS of all its processes.
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
from emulator.testing import cmemu_up, free_port_block


def pss_mb(root: int) -> float:
    """PSS of a process and all its descendants (shared pages split fairly among them)."""
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(root)], capture_output=True, text=True, check=False
    ).stdout.split()
    total = 0.0
    for line in Path(f"/proc/{root}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            total += int(line.split()[1]) / 1024
    return total + sum(pss_mb(int(c)) for c in children)


def boot(args: list[str], timeout_s: float = 300) -> tuple[float, float, int]:
    """(seconds to the state file, total PSS in MB, processes) of one `cmemu up`."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.json"
        started = time.perf_counter()
        with cmemu_up(state, *args, "--broker", "none", timeout_s=timeout_s, quiet=True) as proc:
            seconds = time.perf_counter() - started
            children = subprocess.run(
                ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
            ).stdout.split()
            return seconds, pss_mb(proc.pid), 1 + len(children)


async def events_per_second(url: str, count: int) -> float:
    host, port = url.removeprefix("mqtt://").split(":")
    received = 0
    done = asyncio.Event()
    async with aiomqtt.Client(host, int(port)) as sub:
        await sub.subscribe("cmemu/bench/+/events", qos=1)

        async def consume() -> None:
            nonlocal received
            async for _ in sub.messages:
                received += 1
                if received == count:
                    done.set()
                    return

        consumer = asyncio.ensure_future(consume())
        bus = EventBus(url, "bench", buffer_max=count)
        bus.start()
        started = time.perf_counter()
        for i in range(count):
            bus.event(f"n{i % 48:02d}-npu{i % 8}", "health", i, status="SERVING")
        async with asyncio.timeout(120):
            await done.wait()
        elapsed = time.perf_counter() - started
        await bus.close()
        consumer.cancel()
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
    seconds, pss, procs = boot(["--preset", "cm384", "--mode", "procs", "--per", "node"])
    print(f"cm384_per_node_boot_s  {seconds:.1f}  ({procs} processes; target 30)")
    print(f"cm384_per_node_pss_mb  {pss:,.0f}  (target 4,096)")
    seconds, pss, procs = boot(["--preset", "cm-mini", "--mode", "procs", "--per", "device"])
    print(f"mini_per_device_boot_s {seconds:.1f}  ({procs} processes, {pss:,.0f} MB PSS)")
    asyncio.run(mqtt(args.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
