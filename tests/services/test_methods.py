"""A server's method table (services/methods.py): the generated code's registered methods in one
generic handler, their names shared by every server of the process; a generic handler that
came without registered methods (older generated code) is served as it came. Real servers,
called through real channels."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.testing import free_port_block
from cmemu.services.host import ServiceHost
from cmemu.services.methods import MethodTable

ECHO = "/test.Echo/Say"


def _old_style_echo(server: grpc.aio.Server) -> None:
    """What older generated code does: a generic handler only, no registered methods."""

    async def say(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return b"echo:" + request

    handler = grpc.unary_unary_rpc_method_handler(say)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Echo", {"Say": handler}),)
    )


@pytest.fixture
async def hosts() -> AsyncIterator[list[ServiceHost]]:
    base = free_port_block(2)
    made = [
        ServiceHost(
            name=f"h{i}", address=f"127.0.0.1:{base + i}", services=[("test.Echo", _old_style_echo)]
        )
        for i in range(2)
    ]
    for host in made:
        await host.start()
        await host.set_serving(True)
    yield made
    for host in made:
        await host.stop(0)


async def test_registered_and_generic_only_services_answer_and_unknown_is_unimplemented(
    hosts: list[ServiceHost],
) -> None:
    for host in hosts:
        async with grpc.aio.insecure_channel(host.address) as channel:
            check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            say = channel.unary_unary(ECHO, None, None)
            assert await say(b"hi") == b"echo:hi"
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await channel.unary_unary("/test.Echo/Nope", None, None)(b"")
            assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_two_tables_share_their_method_names() -> None:
    """(Async: a grpc.aio server is made on a running event loop.)"""
    tables = []
    for _ in range(2):
        server = grpc.aio.server()
        table = MethodTable(server)
        health_pb2_grpc.add_HealthServicer_to_server(health_pb2_grpc.HealthServicer(), table)
        tables.append(table)
    first, second = (list(t._methods.handlers) for t in tables)
    assert first == second and "/grpc.health.v1.Health/Check" in first
    assert all(a is b for a, b in zip(first, second, strict=True))  # one string for both
    assert all(not t._generic for t in tables)  # the generated generic handler was replaced
