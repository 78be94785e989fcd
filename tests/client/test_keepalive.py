"""A connection whose packets vanish is found dead: the emulator's channels ping it.

A partitioned container's packets are dropped, not refused: without keepalive a stream on that
connection stays open until TCP gives up (about 15 minutes), so a device's clock stream or the
manager's liveness watch hangs long after the partition is healed. A proxy that swallows every
byte once told to stands in for the partition, between a real channel and a real server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client.channels import CLIENT_OPTIONS, KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from cmemu.emulator.testing import free_port_block
from cmemu.services.host import ServiceHost

KEEPALIVE_OPTIONS = {
    "grpc.keepalive_time_ms",
    "grpc.keepalive_timeout_ms",
    "grpc.http2.ping_timeout_ms",
}
# keepalive finds the connection dead after about KEEPALIVE_TIME + KEEPALIVE_TIMEOUT of wall
# time; a hang bound far above that (a busy host delays the ping's timer, never its meaning)
FOUND_DEAD_WITHIN_S = 10 * (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000


class Blackhole:
    """A TCP proxy that forwards until `cut()`, then reads and drops every byte both ways
    (the peer's TCP stays happy; nothing arrives), as a network partition does."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.cut_off = False
        self._pumps: set[asyncio.Task[None]] = set()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if not self.cut_off:
                    writer.write(data)
                    await writer.drain()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        for pump in (self._pump(reader, up_writer), self._pump(up_reader, writer)):
            task = asyncio.ensure_future(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    @contextlib.asynccontextmanager
    async def serving(self, port: int) -> AsyncIterator[None]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        try:
            yield
        finally:
            server.close()
            for task in list(self._pumps):
                task.cancel()

    def cut(self) -> None:
        self.cut_off = True


async def _watch_until_it_ends(channel: grpc.aio.Channel) -> grpc.StatusCode:
    stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
    try:
        async for _ in stream:
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.slow
async def test_a_stream_over_a_cut_connection_ends_unavailable_and_only_with_keepalive() -> None:
    base = free_port_block(3)
    host = ServiceHost(name="server", address=f"127.0.0.1:{base}", services=[])
    await host.start()
    await host.set_serving(True)
    without = tuple((k, v) for k, v in CLIENT_OPTIONS if k not in KEEPALIVE_OPTIONS)
    assert len(without) < len(CLIENT_OPTIONS)
    proxies = [Blackhole(base), Blackhole(base)]
    try:
        async with proxies[0].serving(base + 1), proxies[1].serving(base + 2):
            pinged = grpc.aio.insecure_channel(f"127.0.0.1:{base + 1}", options=CLIENT_OPTIONS)
            quiet = grpc.aio.insecure_channel(f"127.0.0.1:{base + 2}", options=without)
            watches = [
                asyncio.ensure_future(_watch_until_it_ends(channel)) for channel in (pinged, quiet)
            ]
            await asyncio.sleep(0.5)  # both streams open and answered once
            assert not any(w.done() for w in watches)
            for proxy in proxies:
                proxy.cut()
            code = await asyncio.wait_for(watches[0], FOUND_DEAD_WITHIN_S)
            assert code == grpc.StatusCode.UNAVAILABLE
            # the twin: the same cut, no keepalive, is still open (TCP sees nothing wrong)
            assert not watches[1].done()
            watches[1].cancel()
            await pinged.close(None)
            await quiet.close(None)
    finally:
        await host.server.stop(None)
