"""The fork server of process mode: one process that imports the serve path once and forks every
`cmemu serve` of a run from it, as multiprocessing's forkserver and Gunicorn's preload do.

Why: each exec'd `cmemu serve` imports grpc, the protobuf stubs and the engines by itself, about
0.25 s of CPU and 25 MB of private memory, 48 times for cm384 per node (issue 18). Forked, the
children share the fork server's modules copy-on-write; gc.freeze() keeps the collector of each
child from writing to those pages (it would scan, and so touch, every frozen object).

The supervisor (emulator/runtime/forked.py) execs this once, with one end of a SOCK_SEQPACKET
socketpair as its stdin, and keeps owning every child: a request carries the child's argv (what
`serve_argv` builds), its whole environment and its log file's descriptor (SCM_RIGHTS); the
fork server forks twice (the intermediate exits at once), so the child is re-parented to the
supervisor, a child subreaper, which signals it and reaps it with its exit status as it would
an exec'd one. The reply is the child's pid, once the child stands in a session of its own.
EOF on the socket (the supervisor closed it, or died) ends the fork server.

Before the first fork there must be nothing a child would share by accident: one thread, no
event loop, no gRPC channel or server (grpc has not even initialised its core), no socket but
the supervisor's. A child then starts as an exec'd process would: its own session, its log on 1
and 2, /dev/null on 0, every other descriptor closed, the signal handlers and mask the
interpreter began with, its own environment and RNG seed, and /proc/PID/cmdline showing its own
argv (`ps`, and whatever finds a process by its command line, sees `cmemu serve --node n07`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import json
import os
import random
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

FLAG = "--fork-server"  # `cmemu --fork-server [MODULE...] PAD` (emulator/cli/entry.py)
TITLE_ROOM = 4096  # bytes of the padding argument: the room a child's argv is written into
REQUEST_MAX = 1 << 20  # one request: an argv and an environment
_ARG_START = 48 - 3  # /proc/PID/stat fields 48 and 49 (arg_start, arg_end), counted after comm


def padding() -> str:
    """The last argument of the fork server's command line: room in the kernel's copy of argv
    (the [arg_start, arg_end) range /proc/PID/cmdline shows) for each child's own argv."""
    return " " * TITLE_ROOM


def interpreter() -> list[str]:
    """What precedes the script in this process's command line: the interpreter the script's
    `#!` line named (and its options), as it precedes every exec'd `cmemu`'s arguments."""
    return sys.orig_argv[: len(sys.orig_argv) - len(sys.argv)]


def set_title(argv: Sequence[str]) -> bool:
    """Write `argv` over this process's original argv area, NUL-separated and NUL-padded, so that
    /proc/PID/cmdline shows it (the kernel reads that range; its last byte stays NUL, so the
    arguments stay separate). Cut short when it does not fit; False where /proc says nothing."""
    try:
        fields = Path("/proc/self/stat").read_bytes().rsplit(b")", 1)[1].split()
        start, end = int(fields[_ARG_START]), int(fields[_ARG_START + 1])
    except (OSError, IndexError, ValueError):
        return False
    room = end - start
    if room <= 0:
        return False
    data = b"\0".join(os.fsencode(a) for a in argv)[: room - 1]
    ctypes.memmove(start, data.ljust(room, b"\0"), room)
    return True


def threads() -> int:
    """The threads of this process, as the kernel counts them (C threads too, gRPC's)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def main(
    program: str,
    modules: Sequence[str],
    *,
    preload: Callable[[], None],
    run: Callable[[list[str]], int],
) -> int:
    """Serve fork requests on fd 0 until EOF. `preload` imports what `cmemu serve` runs, plus
    `modules` (what this run's serve processes import lazily, e.g. aiomqtt with a broker);
    `run(argv[1:])` is the serve entry point each child runs."""
    gc.disable()  # no collection while importing: fewer holes in the pages children will share
    handlers = {s: signal.getsignal(s) for s in _catchable()}  # a fresh interpreter's
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # as each child's stdin
    os.close(devnull)
    set_title([*interpreter(), program, FLAG])
    try:
        preload()
        for module in modules:
            __import__(module)
        shared = threads()
        if shared != 1:
            raise RuntimeError(f"{shared} threads after the imports: every fork would share them")
    except Exception as exc:
        traceback.print_exc()
        sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        return 1
    gc.collect()
    gc.freeze()  # every object so far lives in the permanent generation: never scanned again
    sock.send(json.dumps({"ready": os.getpid(), "modules": len(sys.modules)}).encode())
    _Forker(sock=sock, run=run, handlers=handlers).serve()
    return 0


def _catchable() -> list[signal.Signals]:
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


@dataclass(frozen=True, kw_only=True)
class _Forker:
    """The fork server's loop, and what each child is made of."""

    sock: socket.socket  # to the supervisor
    run: Callable[[list[str]], int]  # the serve entry point
    handlers: dict[signal.Signals, Any]  # the signal handlers every child starts with

    def serve(self) -> None:
        """Answer each request with a pid (or an error), until EOF."""
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(self.sock, REQUEST_MAX, 1)
            except ConnectionResetError:
                return
            if not data:
                return  # the supervisor closed its end: its run is over
            try:
                if flags & socket.MSG_TRUNC or len(fds) != 1:
                    raise ValueError(f"a request of {len(data)} bytes and {len(fds)} descriptors")
                request = json.loads(data)
                reply: dict[str, Any] = {"pid": self.fork(request["argv"], request["env"], fds[0])}
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                for fd in fds:
                    os.close(fd)
            self.sock.send(json.dumps(reply).encode())

    def fork(self, argv: list[str], env: dict[str, str], log_fd: int) -> int:
        """Fork the child through an intermediate that exits at once; the child's pid, written
        by the child itself once it has its title and its session."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # nothing of the fork server's buffers written twice
        ready_r, ready_w = os.pipe()
        middle = os.fork()
        if middle == 0:
            try:
                os.close(ready_r)
                if os.fork() == 0:
                    self.child(argv, env, log_fd=log_fd, ready_w=ready_w)
            finally:
                os._exit(0)
        os.close(ready_w)
        try:
            with open(ready_r, "rb") as ready:
                said = ready.read()
        finally:
            os.waitpid(middle, 0)
        if not said:
            raise OSError("the child died before it began (fork failed?)")
        return int(said)

    def child(self, argv: list[str], env: dict[str, str], *, log_fd: int, ready_w: int) -> NoReturn:
        """Become the process `argv` would have exec'd, run it, and exit with its code."""
        code = 1
        try:
            try:
                self.sock.detach()  # its descriptor is closed below: never close another's
                set_title([*interpreter(), *argv])
                os.setsid()  # as start_new_session: a Ctrl-C reaches the supervisor only
            finally:  # the supervisor learns of every child, or it could never reap it
                os.write(ready_w, str(os.getpid()).encode())
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the log's copy, the pipe among them
            for sig, handler in self.handlers.items():
                if handler is not None and signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.environ.clear()
            os.environ.update(env)
            random.seed()  # (the random module reseeds after a fork too: not relied upon)
            gc.enable()
            sys.argv = list(argv)
            code = _run(self.run, argv[1:])
            getattr(threading, "_shutdown", lambda: None)()  # as the interpreter's exit does
            atexit._run_exitfuncs()
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _run(run: Callable[[list[str]], int], args: list[str]) -> int:
    """The entry point's exit code, as the interpreter would make it of a return, a sys.exit()
    or an exception."""
    try:
        return run(args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
