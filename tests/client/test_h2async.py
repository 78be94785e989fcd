"""The asyncio health check (emulator/client/h2async.py) and wait_serving over it, against real
grpc.aio servers (ServiceHost): it must read what grpcio reads, retry a server that is not
listening yet, name the laggard when one never serves, and leave TLS servers to grpc.aio."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from cmemu.emulator.client import h2async, health
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.client.h2probe import ProbeError
from cmemu.emulator.model.errors import UnavailableError
from cmemu.emulator.runtime.tls import make_auto
from cmemu.emulator.testing import free_port_block
from cmemu.services.auth import ServerSecurity
from cmemu.services.host import ServiceHost

FOREVER_S = 60.0  # a generous bound: a busy host must not fail these


@asynccontextmanager
async def serving_host(
    address: str, *, serving: bool = True, security: ServerSecurity | None = None
) -> AsyncIterator[ServiceHost]:
    host = ServiceHost(name="server", address=address, services=[])
    if security is not None:
        host.secure(security)
    await host.start()
    await host.set_serving(serving)
    try:
        yield host
    finally:
        await host.stop(0)


async def test_it_reads_serving_not_serving_and_an_unknown_service() -> None:
    address = f"127.0.0.1:{free_port_block(1)}"
    async with serving_host(address) as host:
        assert await h2async.check(address, timeout_s=FOREVER_S) == 1
        assert await h2async.status(address, timeout_s=FOREVER_S) == "SERVING"
        await host.set_serving(False)
        assert await h2async.check(address, timeout_s=FOREVER_S) == 2
        assert await h2async.status(address, timeout_s=FOREVER_S) == "NOT_SERVING"
        with pytest.raises(ProbeError, match="gRPC error status"):
            await h2async.check(address, "no.such.Service", timeout_s=FOREVER_S)
        unknown = await h2async.status(address, "no.such.Service", timeout_s=FOREVER_S)
        assert unknown.startswith("FAILED:")


async def test_nothing_listening_is_unreachable() -> None:
    address = f"127.0.0.1:{free_port_block(1)}"
    with pytest.raises(OSError):
        await h2async.check(address, timeout_s=FOREVER_S)
    assert await h2async.status_many([address], timeout_s=FOREVER_S) == {address: "UNREACHABLE"}
    with pytest.raises(ValueError):
        await h2async.check("not-an-address")


async def test_many_at_once_within_the_concurrency_bound() -> None:
    base = free_port_block(3)
    addresses = [f"127.0.0.1:{base + i}" for i in range(3)]
    async with serving_host(addresses[0]), serving_host(addresses[1], serving=False):
        found = await h2async.status_many(addresses, timeout_s=FOREVER_S, concurrency=1)
    assert found == {
        addresses[0]: "SERVING",
        addresses[1]: "NOT_SERVING",
        addresses[2]: "UNREACHABLE",
    }


async def test_wait_serving_retries_a_server_that_starts_late() -> None:
    address = f"127.0.0.1:{free_port_block(1)}"
    waiting = asyncio.create_task(health.wait_serving([address], timeout_s=FOREVER_S))
    await asyncio.sleep(0.3)  # it has asked (and found nothing listening) by now, or soon will
    assert not waiting.done()
    async with serving_host(address):
        await waiting  # raises if it gave up


async def test_wait_serving_names_the_server_that_never_serves() -> None:
    base = free_port_block(2)
    serving, stuck = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
    async with serving_host(serving), serving_host(stuck, serving=False):
        with pytest.raises(UnavailableError, match=f"1 servers not SERVING: {stuck} NOT_SERVING"):
            await health.wait_serving([serving, stuck], timeout_s=0.5)
    nobody = f"127.0.0.1:{free_port_block(1)}"
    with pytest.raises(UnavailableError, match=f"{nobody} UNREACHABLE"):
        await health.wait_serving([nobody], timeout_s=0.3)


async def test_a_tls_server_is_checked_through_grpc_with_the_ca(tmp_path: Path) -> None:
    """The bare-socket check speaks plaintext: a TLS server does not answer it, so wait_serving
    reaches TLS servers only through grpc.aio, with the CA of the credentials."""
    address = f"127.0.0.1:{free_port_block(1)}"
    files = await asyncio.to_thread(make_auto, tmp_path, ["127.0.0.1"])
    cert, key, ca = files.read()
    async with serving_host(address, security=ServerSecurity(cert_pem=cert, key_pem=key)):
        assert await h2async.status(address, timeout_s=FOREVER_S) != "SERVING"
        await health.wait_serving(
            [address], timeout_s=FOREVER_S, credentials=Credentials(ca_pem=ca)
        )
        with pytest.raises(UnavailableError, match=address):
            await health.wait_serving([address], timeout_s=0.5)


async def test_a_watch_pushes_each_change_and_ends_when_the_server_stops() -> None:
    address = f"127.0.0.1:{free_port_block(1)}"
    host = ServiceHost(name="server", address=address, services=[])
    await host.start()
    await host.set_serving(True)
    seen: list[int] = []
    statuses = h2async.watch(address, keepalive_s=0.05, keepalive_timeout_s=FOREVER_S)
    try:
        seen.append(await anext(statuses))
        for serving in (False, True) * 10:  # quiet spells between them: pings are answered
            await asyncio.sleep(0.1)
            await host.set_serving(serving)
            seen.append(await anext(statuses))
        await host.stop(0)
        with pytest.raises((OSError, ProbeError)):
            await anext(statuses)
    finally:
        await statuses.aclose()
        await host.stop(0)
    assert seen == [1] + [2, 1] * 10


async def test_a_watch_of_nothing_listening_raises_oserror() -> None:
    statuses = h2async.watch(f"127.0.0.1:{free_port_block(1)}")
    with pytest.raises(OSError):
        await anext(statuses)


async def test_a_watch_of_a_silent_server_ends_when_its_ping_is_not_answered() -> None:
    """A paused or partitioned server: accepted, then nothing, not even a ping's answer."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client goes
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    statuses = h2async.watch(f"127.0.0.1:{port}", keepalive_s=0.05, keepalive_timeout_s=0.05)
    async with server:
        with pytest.raises(ProbeError, match="no answer to a ping"):
            await anext(statuses)


async def test_many_on_bare_sockets_say_what_each_check_says() -> None:
    """status_many's IP addresses go through h2many's bare sockets, names through status():
    each answer as status() gives it, in the order asked, a silent server timed out, and no
    socket left open (a second pass finds the same)."""
    base = free_port_block(5)
    serving, stopped, nobody, silent = (f"127.0.0.1:{base + i}" for i in range(4))
    named = f"localhost:{base + 4}"
    listener = socket.create_server(("127.0.0.1", base + 3))  # accepts, never answers
    try:
        async with (
            serving_host(serving),
            serving_host(stopped, serving=False),
            serving_host(f"127.0.0.1:{base + 4}"),
        ):
            asked = [named, silent, nobody, stopped, serving]
            for _ in range(2):
                found = await h2async.status_many(asked, timeout_s=1.0, concurrency=2)
                assert list(found) == asked
                assert found == {
                    named: "SERVING",
                    silent: "DEADLINE_EXCEEDED",
                    nobody: "UNREACHABLE",
                    stopped: "NOT_SERVING",
                    serving: "SERVING",
                }
    finally:
        listener.close()
    assert await h2async.status_many([], timeout_s=1.0) == {}
    with pytest.raises(ValueError):
        await h2async.status_many(["not-an-address"])
