"""Health/Check of hundreds of plaintext servers at once, on bare non-blocking sockets driven by
the event loop's reader and writer callbacks: what h2async.status_many asks of every IP address.

Why not h2async.status per address: a launch asks each of its servers once (cm384: 629), and an
asyncio stream per check (a task, a transport, a StreamReader, a timeout context, a dozen
awaits) was about half the CPU of that check, the server's own side the other half. Here a
check is a socket and a few callbacks: connect, the same request bytes (h2probe.request), the
same reading of the reply frame by frame (h2probe.Reply), the same statuses out. Names that are
not IP addresses (a compose service's) still go through h2async.status, which resolves them.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import ipaddress
import socket
from collections.abc import Callable

from cmemu.emulator.client import h2probe
from cmemu.emulator.client.h2probe import ProbeError

UNREACHABLE = "UNREACHABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
READ_SIZE = 65536
CONNECTING = (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN)


def ip_family(host: str) -> socket.AddressFamily | None:
    """AF_INET or AF_INET6 for an IP address, None for a name (to be resolved)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if ip.version == 6 else socket.AF_INET


class _Check:
    """One Health/Check of one server: a socket's life from connect to the reply's status,
    reported once through `done(address, status name)`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        address: str,
        family: socket.AddressFamily,
        timeout_s: float,
        done: Callable[[str, str], None],
    ) -> None:
        self.loop, self.address, self._done = loop, address, done
        self.reply = h2probe.Reply()
        self.buffer = b""
        self.frames = 0
        self.out = h2probe.request(address, "")
        self.finished = False
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setblocking(False)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = self.sock.connect_ex(h2probe.split_address(address))
        except OSError:
            self.sock.close()
            raise
        self.fd = self.sock.fileno()
        self.timer = loop.call_later(timeout_s, self.finish, DEADLINE_EXCEEDED)
        if code in CONNECTING:
            loop.add_writer(self.fd, self._connected)
        elif code:
            self.finish(UNREACHABLE)
        else:
            self._connected()

    def _connected(self) -> None:
        if self.finished:  # a callback of this loop iteration, after the end: the descriptor
            return  # may be another check's by now
        self.loop.remove_writer(self.fd)
        if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.finish(UNREACHABLE)
            return
        self.loop.add_reader(self.fd, self._readable)
        self._flush()

    def _flush(self) -> None:
        """Send what is queued; the rest when the socket can take it."""
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.finish(UNREACHABLE)
            return
        self.out = self.out[sent:]
        if self.out:
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        if not self.finished:  # as in _connected
            self.loop.remove_writer(self.fd)
            self._flush()

    def _readable(self) -> None:
        if self.finished:  # as in _connected
            return
        try:
            data = self.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self.finish(UNREACHABLE)
            return
        if not data:
            self.finish("FAILED: the server closed the connection")
            return
        self.buffer += data
        try:
            self._frames()
        except ProbeError as exc:
            self.finish(f"FAILED: {exc}")

    def _frames(self) -> None:
        """Each whole frame to the reply (h2probe.Reply), its answer sent back."""
        while len(self.buffer) >= 9:
            end = 9 + h2probe.length_of(self.buffer)
            if len(self.buffer) < end:
                return
            head, payload = self.buffer[:9], self.buffer[9:end]
            self.buffer = self.buffer[end:]
            answer, status = self.reply.on_frame(head, payload)
            if status is not None:
                self.finish(h2probe.STATUS_NAMES.get(status, str(status)))
                return
            if answer:
                queued = bool(self.out)
                self.out += answer
                if not queued:
                    self._flush()
            self.frames += 1
            if self.frames >= h2probe.MAX_FRAMES:
                raise ProbeError(f"no reply within {h2probe.MAX_FRAMES} frames")

    def finish(self, status: str) -> None:
        if self.finished:
            return
        self.finished = True
        self.timer.cancel()
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        self._done(self.address, status)


async def status_many_ip(
    addresses: list[tuple[str, socket.AddressFamily]], *, timeout_s: float, concurrency: int
) -> dict[str, str]:
    """The status name of every (IP address, its family), at most `concurrency` at a time:
    SERVING, NOT_SERVING, ...; UNREACHABLE, DEADLINE_EXCEEDED or `FAILED: why` as
    h2async.status says them."""
    if not addresses:
        return {}
    loop = asyncio.get_running_loop()
    found: dict[str, str] = {}
    waiting = collections.deque(addresses)
    all_done = loop.create_future()
    checks: list[_Check] = []
    active = ended = 0

    def start_next() -> None:
        nonlocal active
        while waiting and active < concurrency:
            address, family = waiting.popleft()
            active += 1
            try:
                checks.append(_Check(loop, address, family, timeout_s, done))
            except OSError:  # no socket to be had (out of descriptors, say)
                done(address, UNREACHABLE)

    def done(address: str, status: str) -> None:
        nonlocal active, ended
        found[address] = status
        active -= 1
        ended += 1
        if ended == len(addresses):
            if not all_done.done():
                all_done.set_result(None)
        elif waiting:
            loop.call_soon(start_next)

    start_next()
    try:
        await all_done
    finally:
        waiting.clear()
        for check in checks:  # a cancelled wait leaves no socket behind
            check.finish(DEADLINE_EXCEEDED)
    return found
