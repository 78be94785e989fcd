"""The process launcher: one OS process per device (or per node, or per service), supervised.

What a container engine would run, run as plain processes: each gets its command, its
environment and its own loopback address. The supervisor reports every death and restarts
nothing (a chaos test needs a killed device to stay dead); stopping sends SIGTERM to all, waits
for their graceful stop, and kills what is left.

Each process is exec'd, or (with `fork`) forked by a fork server that has imported the serve
path once (emulator/runtime/forked.py); either way it is this process's child, and is signalled,
reaped and reported the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

import structlog

from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.runtime.forked import ForkOptions, ForkServer

log = structlog.get_logger("cmemu.procs")
STOP_GRACE_S = 10.0
FORK_SERVER_LOG = "fork-server.log"  # beside the processes' logs (no server has that id)


@dataclass(frozen=True, kw_only=True)
class ProcSpec:
    """A process to start: its argv, environment and the servers it hosts."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    addresses: tuple[str, ...] = ()  # the gRPC servers it hosts, checked for SERVING
    servers: tuple[str, ...] = ()  # the ids of the devices and services it hosts


class Process(Protocol):
    """What the supervisor uses of a process: asyncio.subprocess.Process's, or a forked one's
    (forked.ForkedProcess)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def send_signal(self, sig: int, /) -> None: ...

    def kill(self) -> None: ...

    async def wait(self) -> int: ...


@dataclass
class Running:
    """A started process, its log file, and its exit code once it ended."""

    spec: ProcSpec
    proc: Process
    log_path: Path
    returncode: int | None = None


class Supervisor:
    """`async with Supervisor(log_dir=...) as sup:` then `await sup.start(specs)`, any number of
    times (waves). Each process has a watcher task in the supervisor's TaskGroup that ends when
    the process does; leaving the block stops every process, so every watcher ends by itself.
    With `fork`, a fork server starts with the first wave and stops with the supervisor."""

    def __init__(
        self,
        *,
        log_dir: Path,
        on_exit: Callable[[Running], None] | None = None,
        fork: ForkOptions | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.on_exit = on_exit
        self.fork = fork
        self.fork_server: ForkServer | None = None
        self.running: dict[str, Running] = {}
        self.stopping = False
        self.died: list[Running] = []  # on their own, before the supervisor stopped them
        self._tasks = asyncio.TaskGroup()

    async def __aenter__(self) -> Supervisor:
        await self._tasks.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.stop()
        finally:
            # every process has exited, so every watcher has ended; an exception of the body
            # propagates as itself, not wrapped in the TaskGroup's ExceptionGroup
            await self._tasks.__aexit__(None, None, None)

    @property
    def launch_path(self) -> str:
        """How its processes start: "fork server" or "exec" (benchmarks report it)."""
        return "exec" if self.fork is None else "fork server"

    def forks(self, spec: ProcSpec) -> bool:
        """Whether `spec` starts from the fork server: a command line of the fork server's own
        program (`cmemu ...`), which a child of it runs exactly as an exec'd one would; any other
        (a compose file's mosquitto) is exec'd."""
        return self.fork is not None and spec.argv[:1] == (self.fork.program,)

    async def start(self, specs: Sequence[ProcSpec]) -> None:
        await asyncio.to_thread(self.log_dir.mkdir, parents=True, exist_ok=True)
        wanted = self.fork is not None and any(self.forks(spec) for spec in specs)
        if wanted and self.fork is not None and self.fork_server is None and not self.stopping:
            server = await ForkServer.start(self.fork, self.log_dir / FORK_SERVER_LOG)
            self.fork_server = server
            self._tasks.create_task(self._watch_fork_server(server), name="watch-fork-server")
        for spec in specs:
            log_path = self.log_dir / f"{spec.name}.log"
            out = await asyncio.to_thread(log_path.open, "ab")
            with out:
                proc = await self._launch(spec, out.fileno())
            running = Running(spec=spec, proc=proc, log_path=log_path)
            self.running[spec.name] = running
            self._tasks.create_task(self._watch(running), name=f"watch-{spec.name}")

    async def _launch(self, spec: ProcSpec, out: int) -> Process:
        env = {**os.environ, **spec.env}
        if self.fork_server is not None and self.forks(spec):
            return await self.fork_server.spawn(spec.argv, env, out)
        return await asyncio.create_subprocess_exec(
            *spec.argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # a Ctrl-C reaches the supervisor, which stops them
        )

    async def _watch_fork_server(self, server: ForkServer) -> None:
        """Not a death of any device: the processes it forked go on; only further starts fail."""
        code = await server.proc.wait()
        if not self.stopping:
            log.warning("fork server exited", pid=server.proc.pid, code=code)

    async def _watch(self, running: Running) -> None:
        running.returncode = await running.proc.wait()
        if not self.stopping:
            self.died.append(running)
            log.warning(
                "process exited",
                process=running.spec.name,
                pid=running.proc.pid,
                code=running.returncode,
                log=str(running.log_path),
            )
            if self.on_exit is not None:
                self.on_exit(running)

    def check_alive(self) -> None:
        """Raise when a process died while the emulator was starting (with its log's tail)."""
        if self.died:
            first = self.died[0]
            tail = first.log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise UnavailableError(
                f"{len(self.died)} processes exited during start, first {first.spec.name} "
                f"(code {first.returncode}): {' | '.join(tail)}"
            )

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to all (they turn NOT_SERVING and drain), then SIGKILL what is left; and
        the fork server, if any."""
        self.stopping = True
        try:
            await self._stop_processes(grace_s)
        finally:
            if self.fork_server is not None:
                await self.fork_server.close()

    async def _stop_processes(self, grace_s: float) -> None:
        alive = [r for r in self.running.values() if r.proc.returncode is None]
        for r in alive:
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_s):
                await asyncio.gather(*(r.proc.wait() for r in alive))
        except TimeoutError:
            for r in alive:
                if r.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        r.proc.kill()
            await asyncio.gather(*(r.proc.wait() for r in alive))
