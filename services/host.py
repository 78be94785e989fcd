"""One gRPC server for one device: bind, reflection, health, graceful stop.

Each device gets its own grpc.aio server so that its identity is its address. Ports are bound with
SO_REUSEPORT off, so that two devices (or two emulators) on one address fail loudly instead of
silently sharing the port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from emulator.model.errors import AddressInUseError
from services.reflection import enable_reflection

HEALTH_SERVICE = "grpc.health.v1.Health"
SERVER_OPTIONS = (("grpc.so_reuseport", 0),)

Register = Callable[[grpc.aio.Server], None]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ServiceHost:
    """A grpc.aio server with its services registered, reflection and per-service health."""

    def __init__(
        self, *, name: str, address: str, services: Iterable[tuple[str, Register]]
    ) -> None:
        self.name = name
        self.address = address
        self._services = dict(services)
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        self.health = HealthServicer()
        for register in self._services.values():
            register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection(self.server, [*self._services, HEALTH_SERVICE])

    @property
    def service_names(self) -> list[str]:
        """Every name whose health is set explicitly: "" (the whole server) and each service."""
        return ["", *self._services]

    async def start(self) -> None:
        """Bind and start, every service NOT_SERVING until the device says otherwise."""
        await self.set_serving(False)
        try:
            port = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise AddressInUseError(self.name, self.address) from exc
        if port == 0:
            raise AddressInUseError(self.name, self.address)
        await self.server.start()

    async def set_serving(self, serving: bool) -> None:
        status = SERVING if serving else NOT_SERVING
        for service in self.service_names:
            await self.health.set(service, status)

    async def stop(self, grace_s: float) -> None:
        await self.set_serving(False)
        await self.server.stop(grace_s)
