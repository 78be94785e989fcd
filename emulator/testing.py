"""Helpers for tests of the emulator and of software built on it (as structlog ships testing.py).

They start real servers on real ports; nothing here fakes a device.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from emulator.client.clients import Clients
from emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.model.topology import build, server_count
from emulator.runtime.supernode import CMEMU, NO_BROKER, LaunchOptions, Supernode

__all__ = [
    "CMEMU",
    "MINI_DEVICES",
    "MINI_PORTS",
    "MINI_SERVERS",
    "Clients",
    "Supernode",
    "calls_per_second",
    "cmemu_up",
    "free_port_block",
    "next_sse_event",
    "run_cmemu",
    "running_supernode",
]

# cm-mini, the tests' preset: its device servers; with the supernode-wide services; and the ports
# a launcher binds for it (an HTTP endpoint too)
_MINI = build("cm-mini")
MINI_DEVICES = len(_MINI.devices)
MINI_SERVERS = MINI_DEVICES + len(_MINI.services)
MINI_PORTS = server_count(_MINI)

# Below Linux's ephemeral range (32768+), so that client sockets do not take these ports.
SEARCH_FROM, SEARCH_TO = 22000, 32000


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(count: int, host: str = "127.0.0.1", *, start: int = SEARCH_FROM) -> int:
    """The first port of `count` consecutive ports that are free on `host` right now."""
    base = start
    while base + count <= SEARCH_TO:
        taken = next((p for p in range(base, base + count) if not _free(host, p)), None)
        if taken is None:
            return base
        base = taken + 1
    raise RuntimeError(f"no block of {count} free ports between {start} and {SEARCH_TO}")


@asynccontextmanager
async def running_supernode(
    preset: str = "cm-mini",
    *,
    time_scale: float = 1.0,
    profile: HardwareProfile = DEFAULT_PROFILE,
    broker: str = NO_BROKER,
) -> AsyncIterator[Supernode]:
    """A whole supernode in this process on a free block of ports, verified SERVING, stopped on
    exit. No MQTT unless `broker` names one (or is EMBEDDED)."""
    base = free_port_block(server_count(build(preset, profile=profile)))
    options = LaunchOptions(
        preset=preset,
        base_port=base,
        time_scale=time_scale,
        profile=profile,
        broker=broker,
        drain_s=0.0,
    )
    async with Supernode.start(options) as supernode:
        yield supernode


def run_cmemu(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`cmemu ARGS` as a real process, its output captured, its exit code left to the caller."""
    return subprocess.run(
        [CMEMU, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


@contextmanager
def cmemu_up(
    state_file: Path,
    *args: str,
    timeout_s: float = 120.0,
    output: list[str] | None = None,
    quiet: bool = False,
) -> Iterator[subprocess.Popen[str]]:
    """`cmemu up ARGS --state-file STATE_FILE` as a real process, yielded once it has written
    the state file (every server SERVING); on exit SIGINT, and its stdout appended to `output`.
    Quiet, its stderr still goes to a file, so that a failed start says why."""
    sink = subprocess.DEVNULL if quiet else subprocess.PIPE
    errors = tempfile.TemporaryFile(mode="w+") if quiet else None  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            CMEMU,
            *(["--log-level", "warning"] if quiet else []),
            "up",
            *args,
            "--state-file",
            str(state_file),
        ],
        stdout=sink,
        stderr=errors or sink,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not state_file.exists():
            if proc.poll() is not None:
                said = proc.communicate()[1] or ""
                if errors is not None:
                    errors.seek(0)
                    said = errors.read()[-4000:]
                raise RuntimeError(f"cmemu up exited {proc.returncode}: {said}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"cmemu up wrote no state file within {timeout_s} s")
            time.sleep(0.01)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=120)
        except ValueError:  # the caller already read it to the end
            out = ""
        if output is not None:
            output.append(out or "")
        if errors is not None:
            errors.close()


async def next_sse_event(response: aiohttp.ClientResponse) -> tuple[str, dict[str, Any]]:
    """The next event of a server-sent event stream (the web view's /events): its name and
    its JSON data; comment lines are skipped."""
    event, data = "message", ""
    while True:
        line = (await response.content.readline()).decode().rstrip("\n")
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data += line.removeprefix("data: ")
        elif not line and data:
            return event, json.loads(data)


async def calls_per_second(
    call: Callable[[], Awaitable[object]], seconds: float, concurrency: int
) -> float:
    """Calls per second completed by `concurrency` loops over `seconds` of wall time: the load
    loop of the benchmarks."""
    done = 0
    stop_at = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await call()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)
