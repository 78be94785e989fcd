"""The supervisor's side of the fork server (emulator/runtime/forkserver.py): start it once per
run, ask it for each process, and own every process it forks exactly as an exec'd one is owned.

Ownership rests on the kernel, not on the fork server: the supervisor's process marks itself a
child subreaper (prctl PR_SET_CHILD_SUBREAPER) while a fork server of it runs, the fork server
forks each child through an intermediate that exits at once, and so each child becomes the
supervisor's own child. The supervisor watches it through a pidfd (readable when it exits),
reaps it with waitpid for its exit status, and signals it through the pidfd (never a recycled
pid: an unreaped child's pid cannot be reused). A ForkedProcess offers what the supervisor uses
of asyncio.subprocess.Process (pid, returncode, send_signal, kill, wait), so the supervisor,
the deaths report and the process faults see no difference. If the fork server dies, the next
start raises UnavailableError; the processes it forked keep running, owned as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from cmemu.emulator.model.errors import InvalidArgumentError, UnavailableError
from cmemu.emulator.runtime.forkserver import FLAG, padding

log = structlog.get_logger("cmemu.forked")
FORK_ENV = "CMEMU_FORK"  # 0: exec every process (debugging); 1 (the default): fork them
READY_TIMEOUT_S = 120.0  # its imports, on a loaded host
REPLY_TIMEOUT_S = 60.0  # one fork
CLOSE_GRACE_S = 5.0
REPLY_MAX = 65536
UNKNOWN_CODE = 255  # a child someone else reaped: its status is lost
_PR_SET_CHILD_SUBREAPER = 36


def fork_wanted(environ: Mapping[str, str]) -> bool:
    """Whether process mode forks its processes: $CMEMU_FORK, 1 unless it says 0; never where
    there are no pidfds (not Linux): there every process is exec'd, as before."""
    value = environ.get(FORK_ENV, "1")
    if value not in ("0", "1"):
        raise InvalidArgumentError(f"${FORK_ENV}={value!r}: 1 forks the processes, 0 execs them")
    return value == "1" and hasattr(os, "pidfd_open")


@dataclass(frozen=True, kw_only=True)
class ForkOptions:
    """How to start a fork server: the `cmemu` program, and the modules its serve processes
    import lazily that it should import first (aiomqtt when the run has a broker)."""

    program: str
    modules: tuple[str, ...] = ()


class _Subreaper:
    """PR_SET_CHILD_SUBREAPER held while any fork server of this process runs, and dropped
    after: an orphan of anything else this process started (a detached `cmemu up`) goes to init
    as before, instead of waiting as a zombie for a reaper that does not know it."""

    users = 0

    @classmethod
    def acquire(cls) -> None:
        if cls.users == 0:
            _set_subreaper(True)
        cls.users += 1

    @classmethod
    def release(cls) -> None:
        cls.users -= 1
        if cls.users == 0:
            _set_subreaper(False)


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        reason = os.strerror(ctypes.get_errno())
        raise UnavailableError(f"prctl(PR_SET_CHILD_SUBREAPER, {int(on)}): {reason}")


class ForkedProcess:
    """A child the fork server made and this process reaps: the surface of
    asyncio.subprocess.Process the supervisor uses. Made in the event loop's thread."""

    def __init__(self, pid: int) -> None:
        # ChildProcessError unless it is this process's own child (and so cannot be recycled)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pid, code = self.pid, UNKNOWN_CODE
        if pid == 0:
            return  # not yet
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = code  # negative: the signal that ended it, as asyncio reports it
        self._exited.set_result(code)

    def send_signal(self, sig: int, /) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class ForkServer:
    """One fork server and the socket to it; `await ForkServer.start(...)`, then `spawn` any
    number of times, then `close`. Requests go one at a time (the server forks one at a time)."""

    def __init__(self, sock: socket.socket, proc: asyncio.subprocess.Process, log: Path) -> None:
        self._sock = sock
        self.proc = proc
        self.log_path = log
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def start(cls, options: ForkOptions, log_path: Path) -> ForkServer:
        """Start it and wait until it has imported the serve path (UnavailableError if not)."""
        _Subreaper.acquire()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            out = await asyncio.to_thread(log_path.open, "ab")
            with out, theirs:
                proc = await asyncio.create_subprocess_exec(
                    options.program, FLAG, *options.modules, padding(),
                    stdin=theirs.fileno(), stdout=out, stderr=out,
                    start_new_session=True,  # as every process of the run
                )  # fmt: skip
        except BaseException:
            ours.close()
            _Subreaper.release()
            raise
        server = cls(ours, proc, log_path)
        try:
            hello = await server._exchange(None, None, READY_TIMEOUT_S)
            if "ready" not in hello:
                raise UnavailableError(f"the fork server could not start: {hello.get('error')}")
        except BaseException:
            await server.close()
            raise
        log.debug("fork server ready", pid=proc.pid, modules=hello.get("modules"))
        return server

    async def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], log_fd: int
    ) -> ForkedProcess:
        """A process running `argv` (a `cmemu serve` command line) with exactly `env`, its
        output on `log_fd`, in a session of its own."""
        request = json.dumps({"argv": list(argv), "env": dict(env)}).encode()
        reply = await self._exchange(request, log_fd, REPLY_TIMEOUT_S)
        if "pid" not in reply:
            raise UnavailableError(f"the fork server could not start {argv[-1]}: {reply['error']}")
        pid = int(reply["pid"])
        try:
            return ForkedProcess(pid)
        except ChildProcessError:  # re-parented elsewhere: this process could never reap it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise UnavailableError(
                f"process {pid} ({argv[-1]}) is not this supervisor's child: is it no longer "
                "a child subreaper?"
            ) from None

    async def _exchange(self, request: bytes | None, fd: int | None, wait_s: float) -> Any:
        async with self._lock:
            asked = asyncio.ensure_future(asyncio.to_thread(self._ask, request, fd, wait_s))
            try:
                return await asyncio.shield(asked)
            except asyncio.CancelledError:
                asked.add_done_callback(_kill_unowned)  # a child nobody will own: ended
                raise

    def _ask(self, request: bytes | None, fd: int | None, timeout: float) -> Any:
        """One request and its reply (or only a reply: the greeting), in a worker thread."""
        pid = self.proc.pid
        try:
            self._sock.settimeout(timeout)
            if request is not None and fd is not None:
                socket.send_fds(self._sock, [request], [fd])
            reply = self._sock.recv(REPLY_MAX)
        except TimeoutError:
            raise UnavailableError(
                f"the fork server (pid {pid}) did not answer within {timeout:g} s"
            ) from None
        except OSError as exc:
            raise UnavailableError(f"the fork server (pid {pid}) is gone: {exc}") from None
        if not reply:
            tail = " | ".join(_tail(self.log_path))
            raise UnavailableError(f"the fork server (pid {pid}) has exited; its log: {tail}")
        return json.loads(reply)

    async def close(self) -> None:
        """End it (EOF on its socket, then SIGKILL after a grace), and drop the subreaper mark
        when it was the last of this process. Once."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a worker thread still waiting
        self._sock.close()
        try:
            async with asyncio.timeout(CLOSE_GRACE_S):
                await self.proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        finally:
            _Subreaper.release()


def _kill_unowned(asked: asyncio.Future[Any]) -> None:
    """A fork whose asker was cancelled: the child exists but no supervisor holds it."""
    if asked.cancelled() or asked.exception() is not None or "pid" not in asked.result():
        return
    child = ForkedProcess(int(asked.result()["pid"]))  # reaped by its pidfd reader
    child.kill()


def _tail(path: Path, lines: int = 3) -> list[str]:
    try:
        return path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return []
