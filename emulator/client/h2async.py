"""grpc.health.v1.Health/Check over plaintext HTTP/2 on asyncio streams: the blocking probe of
h2probe.py (the same request, the same reading of the reply) for checking hundreds of servers
at once from a running event loop.

Why not a grpc.aio channel per server: a launch verifies that each of its servers answers
SERVING once (cm384: 629 servers), and a grpc.aio channel costs far more to open and close
than the call itself (about 1 ms of CPU each, its subchannel, resolver and C-core state); one
socket, five frames out, a handful in, is all one unary health call is on the wire, and it is
still a real gRPC call as a client makes it. TLS servers are checked with grpc.aio
(emulator/client/health.py): this speaks plaintext only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable

from cmemu.emulator.client import h2many, h2probe
from cmemu.emulator.client.h2probe import (
    ACK,
    DATA,
    END_STREAM,
    GOAWAY,
    PING,
    RST_STREAM,
    SETTINGS,
    STREAM,
    ProbeError,
    frame,
)

WINDOW_UPDATE = 0x8
WATCH_PATH = "/grpc.health.v1.Health/Watch"

STATUS_NAMES = h2probe.STATUS_NAMES
UNREACHABLE = "UNREACHABLE"  # nothing accepted the connection (yet)
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"  # accepted, no whole reply within the time


async def check(address: str, service: str = "", timeout_s: float = 2.0) -> int:
    """The served status (1 SERVING, 2 NOT_SERVING, ...) of `service` at HOST:PORT. OSError
    when unreachable, ProbeError when the call fails, TimeoutError after `timeout_s`,
    ValueError for an address that is not HOST:PORT."""
    host, port = h2probe.split_address(address)
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(h2probe.request(address, service))
            reply = h2probe.Reply()
            for _ in range(h2probe.MAX_FRAMES):
                try:
                    head = await reader.readexactly(9)
                    payload = await reader.readexactly(h2probe.length_of(head))
                except asyncio.IncompleteReadError as exc:
                    raise ProbeError("the server closed the connection") from exc
                answer, status = reply.on_frame(head, payload)
                if answer:
                    writer.write(answer)
                if status is not None:
                    return status
            raise ProbeError(f"no reply within {h2probe.MAX_FRAMES} frames")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def status(address: str, service: str = "", timeout_s: float = 2.0) -> str:
    """The health of `service` at `address` as a name, never raising for the server's own
    state: SERVING, NOT_SERVING, ...; UNREACHABLE when nothing accepts the connection,
    DEADLINE_EXCEEDED when it does not answer in time, and the failure itself (`FAILED: the
    server reset the call`, an unknown service's error status) when the call fails."""
    try:
        found = await check(address, service, timeout_s)
    except TimeoutError:
        return DEADLINE_EXCEEDED
    except OSError:
        return UNREACHABLE
    except ProbeError as exc:
        return f"FAILED: {exc}"
    return STATUS_NAMES.get(found, str(found))


async def status_many(
    addresses: Iterable[str], *, timeout_s: float = 2.0, concurrency: int = 128
) -> dict[str, str]:
    """status() of every address (the whole server: service ""), at most `concurrency`
    connections open at a time: IP addresses on bare sockets (h2many.py: the same call for
    half the CPU), names through status() (it resolves them)."""
    limit = asyncio.Semaphore(concurrency)
    ips, names, order = [], [], list(addresses)
    for address in order:
        family = h2many.ip_family(h2probe.split_address(address)[0])  # ValueError: not HOST:PORT
        if family is None:
            names.append(address)
        else:
            ips.append((address, family))

    async def one(address: str) -> tuple[str, str]:
        async with limit:
            return address, await status(address, "", timeout_s)

    named = dict(await asyncio.gather(*(one(a) for a in names)))
    found = await h2many.status_many_ip(ips, timeout_s=timeout_s, concurrency=concurrency)
    return {a: found[a] if a in found else named[a] for a in order}  # in the order asked


async def watch(
    address: str,
    service: str = "",
    *,
    connect_timeout_s: float = 5.0,
    keepalive_s: float = 10.0,
    keepalive_timeout_s: float = 10.0,
) -> AsyncGenerator[int, None]:
    """grpc.health.v1.Health/Watch of `service` at HOST:PORT: each served status as the server
    pushes it (the first at once), for as long as the stream lasts. Ends by raising: OSError
    when unreachable or cut, ProbeError when the server ends the call (GOAWAY, a reset, an
    error status) or does not answer a ping within `keepalive_timeout_s` after `keepalive_s`
    of silence (a paused or partitioned server, as a grpc.aio channel's keepalive finds it).

    The web view watches every device so (cm384: 624 streams from the launch's own process):
    a grpc.aio channel each costs about 50 KB and a millisecond of CPU to open; a socket and a
    StreamReader, a few KB. Window updates give back what each message used, so the stream
    never stalls on flow control."""
    host, port = h2probe.split_address(address)
    async with asyncio.timeout(connect_timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(h2probe.request(address, service, path=WATCH_PATH))
        body = b""
        while True:
            head = await _next_head(reader, writer, keepalive_s, keepalive_timeout_s)
            try:
                payload = await reader.readexactly(h2probe.length_of(head))
            except asyncio.IncompleteReadError as exc:
                raise ProbeError("the server closed the connection") from exc
            kind, flags = head[3], head[4]
            stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            if kind == SETTINGS and not flags & ACK:
                writer.write(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                writer.write(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise ProbeError("the server sent GOAWAY")
            elif kind == RST_STREAM and stream == STREAM:
                raise ProbeError("the server reset the call")
            elif kind == DATA and stream == STREAM and payload:
                increment = len(payload).to_bytes(4, "big")
                writer.write(frame(WINDOW_UPDATE, 0, 0, increment))
                writer.write(frame(WINDOW_UPDATE, 0, STREAM, increment))
                body += payload
                while len(body) >= 5 and len(body) >= 5 + (
                    size := int.from_bytes(body[1:5], "big")
                ):
                    yield h2probe.status_of(body[5 : 5 + size])
                    body = body[5 + size :]
            if stream == STREAM and flags & END_STREAM:
                raise ProbeError("the server ended the watch (a gRPC status)")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _next_head(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle_s: float, timeout_s: float
) -> bytes:
    """The next frame's head; after `idle_s` of silence a PING, which must be answered (any
    frame will do) within `timeout_s`. A cancelled readexactly consumes nothing."""
    try:
        try:
            async with asyncio.timeout(idle_s):
                return await reader.readexactly(9)
        except TimeoutError:
            writer.write(frame(PING, 0, 0, b"cmemu-ka"))
        try:
            async with asyncio.timeout(timeout_s):
                return await reader.readexactly(9)
        except TimeoutError:
            raise ProbeError(f"no answer to a ping within {timeout_s:g} s") from None
    except asyncio.IncompleteReadError as exc:
        raise ProbeError("the server closed the connection") from exc
