"""A new channel reaches a server started again on the same port at once: its connections are
its own, not those of an older channel in this process that saw the port refuse
(emulator/client/channels.py, `grpc.use_local_subchannel_pool`)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from cmemu.emulator.client.channels import CLIENT_OPTIONS
from cmemu.emulator.testing import free_port_block

# the reconnect backoff of both channels set long: an inherited refusal would outlast any delay
# a busy host puts between the restart and the new channel's call
LONG_BACKOFF = (
    ("grpc.initial_reconnect_backoff_ms", 60_000),
    ("grpc.max_reconnect_backoff_ms", 60_000),
    ("grpc.min_reconnect_backoff_ms", 60_000),
)


async def _serving(address: str) -> grpc.aio.Server:
    server = grpc.aio.server()
    health = HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(address)
    await server.start()
    return server


async def _check(channel: grpc.aio.Channel) -> str:
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK"


async def _new_channel_after_a_restart(options: Sequence[tuple[str, object]]) -> str:
    address = f"127.0.0.1:{free_port_block(1)}"
    opts = [(k, v) for k, v in options if "reconnect_backoff" not in k] + list(LONG_BACKOFF)
    first = await _serving(address)
    old = grpc.aio.insecure_channel(address, options=opts)
    second: grpc.aio.Server | None = None
    try:
        assert await _check(old) == "OK"
        await first.stop(0)
        assert await _check(old) == "UNAVAILABLE"  # it saw the port refuse
        second = await _serving(address)
        new = grpc.aio.insecure_channel(address, options=opts)
        try:
            return await _check(new)
        finally:
            await new.close(None)
    finally:
        await old.close(None)
        if second is not None:
            await second.stop(0)


async def test_a_new_channel_reaches_a_restarted_server_at_once() -> None:
    assert await _new_channel_after_a_restart(CLIENT_OPTIONS) == "OK"


async def test_its_twin_sharing_the_process_s_subchannels_inherits_the_refusal() -> None:
    shared = [(k, v) for k, v in CLIENT_OPTIONS if k != "grpc.use_local_subchannel_pool"]
    assert await _new_channel_after_a_restart(shared) == "UNAVAILABLE"
