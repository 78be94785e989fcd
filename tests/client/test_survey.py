"""Issue 21 finding 16: `cmemu status` (health.survey) must not report its own slowness as the
devices' health. Real gRPC servers with a health service of their own stand in for devices a
busy host answers late: one misses the survey's first deadline and then answers at once (a
host that caught up: SERVING, not DEADLINE_EXCEEDED), one never answers (a hung device, or a
host too busy even for the second ask: NO_ANSWER, never a status of the device's own), one is
NOT_SERVING and one is gone (UNREACHABLE). Checks go at most `concurrency` at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client import health
from cmemu.emulator.testing import free_port_block

TIMEOUT_S = 1.0  # the survey's first deadline; the second ask has twice that
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Device(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # generated, untyped
    """A health service that answers `status` at once, except for its first `held` checks,
    which wait until the caller has gone (a late answer nobody reads). Counts the checks in
    flight across every server that shares it."""

    def __init__(self, status: int = SERVING, *, held: int = 0, pause_s: float = 0.0) -> None:
        self.status = status
        self.held = held
        self.pause_s = pause_s
        self.checks = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self._never = asyncio.Event()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        self.checks += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.checks <= self.held:
                await self._never.wait()  # ended by the caller's deadline (cancelled)
            await asyncio.sleep(self.pause_s)
            return health_pb2.HealthCheckResponse(status=self.status)
        finally:
            self.in_flight -= 1


@contextlib.asynccontextmanager
async def serving(devices: list[Device]) -> AsyncIterator[list[str]]:
    """A real gRPC server per device, on consecutive free ports: their addresses, then the
    next port's, where nothing listens (free_port_block leaves the ports after a block free)."""
    base = free_port_block(len(devices))
    servers = []
    try:
        for port, device in enumerate(devices, start=base):
            server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(device, server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            servers.append(server)
        yield [f"127.0.0.1:{port}" for port in range(base, base + len(devices) + 1)]
    finally:
        await asyncio.gather(*(s.stop(0) for s in servers))


async def test_a_late_answer_is_asked_again_and_a_missing_one_is_no_answer() -> None:
    late, hung, down = Device(held=1), Device(held=1_000), Device(NOT_SERVING)
    async with serving([late, hung, down]) as (late_at, hung_at, down_at, gone_at):
        surveyed = await health.survey([late_at, hung_at, down_at, gone_at], timeout_s=TIMEOUT_S)
    assert surveyed == {
        late_at: "SERVING",  # missed the first deadline only: the host's slowness, not its
        hung_at: health.NO_ANSWER,
        down_at: "NOT_SERVING",
        gone_at: health.UNREACHABLE,
    }
    assert (late.checks, hung.checks, down.checks) == (2, 2, 1)  # asked again only when late


async def test_one_ask_alone_would_report_the_late_device_as_timed_out() -> None:
    """The twin: the same late device under a single check_many (what status did before) is
    DEADLINE_EXCEEDED, so the SERVING above is the second ask's doing."""
    late = Device(held=1)
    async with serving([late]) as [address, _]:
        assert await health.check_many([address], timeout_s=TIMEOUT_S) == {
            address: "DEADLINE_EXCEEDED"
        }


async def test_checks_go_at_most_concurrency_at_a_time() -> None:
    shared = Device(pause_s=0.2)  # every server's checks overlap while it pauses
    async with serving([shared] * 8) as [*addresses, _]:
        surveyed = await health.survey(addresses, timeout_s=10.0, concurrency=3)
    assert set(surveyed.values()) == {"SERVING"} and shared.checks == 8
    assert 1 <= shared.most_in_flight <= 3, shared.most_in_flight
