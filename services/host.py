"""One gRPC server for one device: bind, reflection, health, graceful stop.

Each device gets its own grpc.aio server so that its identity is its address. Ports are bound with
SO_REUSEPORT off, so that two devices (or two emulators) on one address fail loudly instead of
silently sharing the port.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from emulator.client.channels import SERVER_KEEPALIVE_OPTIONS
from emulator.model.address import parse_address
from emulator.model.errors import AddressError, AddressInUseError, InvalidArgumentError
from services.auth import OPEN, ServerSecurity
from services.reflection import enable_reflection
from services.rpc import GUARD, HangGate

DEVICE_MANAGEMENT = frozenset(
    {"SetFaultState", "InjectFault", "ClearFault", "ListFaults", "WatchLiveness"}
)
"""Device methods a hung device still answers: the fault-control path (GetFaultState is a
health probe like any other call: it hangs too)."""

HEALTH_SERVICE = "grpc.health.v1.Health"
SERVER_OPTIONS = (("grpc.so_reuseport", 0), *SERVER_KEEPALIVE_OPTIONS)

Register = Callable[[grpc.aio.Server], None]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _resolve(name: str, address: str) -> None:
    """grpc reports an unresolvable host like a port in use (RuntimeError): resolve it first,
    without blocking the loop, so that each failure says what it is."""
    if address.startswith("unix:"):
        return
    try:
        at = parse_address(address, any_port=True)
    except InvalidArgumentError as exc:
        raise AddressError(name, address, str(exc)) from exc
    host = at.host
    if host in ("0.0.0.0", "::", "*") or _is_ip(host):
        return  # nothing to resolve (and no thread to spend on it per server)
    try:
        await asyncio.get_running_loop().getaddrinfo(host, at.port)
    except (OSError, UnicodeError) as exc:
        raise AddressError(name, address, f"cannot resolve {host}") from exc


class ServiceHost:
    """A grpc.aio server with its services registered, reflection and per-service health."""

    def __init__(
        self,
        *,
        name: str,
        address: str,
        services: Iterable[tuple[str, Register]],
        security: ServerSecurity = OPEN,
    ) -> None:
        self.name = name
        self.address = address
        self._services = dict(services)
        self.health = HealthServicer()
        self.gate = HangGate(DEVICE_MANAGEMENT)  # a `hang` fault closes it
        self.extra_health: list[str] = []  # more health names (an NPU's dies, "n00-npu3.d1")
        self.secure(security)

    def secure(self, security: ServerSecurity) -> None:
        """(Re)build the server guarded by `security` (services/auth.py): its token interceptor
        and how it binds (TLS or not). Before start."""
        self.security = security
        self.server = grpc.aio.server(
            options=SERVER_OPTIONS,
            interceptors=[GUARD, self.gate, *security.interceptors()],
        )
        for register in self._services.values():
            register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection(self.server, [*self._services, HEALTH_SERVICE])

    @property
    def service_names(self) -> list[str]:
        """Every name whose health is set explicitly: "" (the whole server) and each service."""
        return ["", *self._services, *self.extra_health]

    async def start(self) -> None:
        """Bind and start, every service NOT_SERVING until the device says otherwise."""
        self.security.check_bind(self.name, self.address)
        await self.set_serving(False)
        await _resolve(self.name, self.address)
        try:
            port = self.security.bind(self.server, self.address)
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
