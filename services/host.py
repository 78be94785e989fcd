"""One gRPC server for one device: bind, reflection, health, graceful stop.

Each device gets its own grpc.aio server so that its identity is its address. Ports are bound with
SO_REUSEPORT off, so that two devices (or two emulators) on one address fail loudly instead of
silently sharing the port.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from cmemu.emulator.client.channels import SERVER_KEEPALIVE_OPTIONS
from cmemu.emulator.model.address import parse_address
from cmemu.emulator.model.errors import (
    AddressError,
    AddressInUseError,
    EmulatorError,
    InvalidArgumentError,
    bind_error,
)
from cmemu.services.auth import OPEN, ServerSecurity
from cmemu.services.hanggate import HangGate
from cmemu.services.methods import MethodTable
from cmemu.services.reflection import enable_reflection
from cmemu.services.rpc import GUARD

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
HealthListener = Callable[[int | None], None]
"""Hears a server's whole health ("" service) as a Watch would: SERVING, NOT_SERVING, or None
when no server answers (stopped: crashed, or not restarted yet)."""


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


def why_unbound(name: str, address: str, listen: str) -> EmulatorError:
    """Why grpc could not bind `listen`: it says only that it failed (a port of 0, or a
    RuntimeError) for every cause, so the system is asked with a plain bind of the same address.
    A port held elsewhere is ADDRESS_IN_USE; an address this machine or container cannot use
    (not one of its own, no IPv6, no permission) says so (ADDRESS_UNUSABLE), as HTTP servers'
    binds do (bind_error), so that nobody hunts for a process holding a port none holds."""
    if listen.startswith("unix:"):
        return AddressInUseError(name, address)
    at = parse_address(listen, any_port=True)
    # grpc binds a wildcard on IPv6 and IPv4, and on IPv4 alone where there is no IPv6 (a
    # container's network): the IPv4 bind is the one that decides there
    hosts = ["::", "0.0.0.0"] if at.host in ("::", "*") else [at.host]
    for host in hosts:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc's own
                probe.bind((host, at.port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE or host == hosts[-1]:
                return bind_error(name, address, exc)
    return AddressError(  # free again by now (its holder gone), or refused by grpc alone
        name,
        address,
        f"grpc could not listen on {listen}, which the system lets bind now (grpc's log says why)",
        reason="ADDRESS_UNUSABLE",
    )


def listen_address(address: str) -> str:
    """Where a server listens for `address`: itself, unless its host is a name (a container's
    or a pod's, `n00-npu5:50051`): then every interface, on its port. gRPC binds a name to the
    addresses it resolves to at bind time, and a container reconnected to its network (the
    container-disconnect fault, a network hiccup) may come back at another address, where
    nothing would listen: its peers' calls were refused until it restarted. `localhost` stays
    itself (a wildcard would open a loopback server to the network)."""
    if address.startswith("unix:"):
        return address
    at = parse_address(address, any_port=True)
    if at.host in ("0.0.0.0", "::", "*", "localhost") or _is_ip(at.host):
        return address
    return f"[::]:{at.port}"


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
        self._status = NOT_SERVING  # the whole server's, as last set
        self._answering = False  # started and not stopped
        self._told: int | None = None  # what the listeners last heard
        self._listeners: set[HealthListener] = set()
        self.secure(security)

    def secure(self, security: ServerSecurity) -> None:
        """(Re)build the server guarded by `security` (services/auth.py): its token interceptor
        and how it binds (TLS or not). Before start."""
        self.security = security
        self.server = grpc.aio.server(
            options=SERVER_OPTIONS,
            interceptors=[GUARD, self.gate, *security.interceptors()],
        )
        table = MethodTable(self.server)
        generic = cast("grpc.aio.Server", table)
        for register in self._services.values():
            register(generic)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, generic)
        table.install()
        enable_reflection(self.server, (*self._services, HEALTH_SERVICE))

    @property
    def kind(self) -> tuple[object, ...]:
        """What servers of one kind share: how they are guarded and the services registered
        (every NPU's server is one kind, the fabric's another)."""
        return (self.security.tls, self.security.token is not None, *self._services)

    @property
    def service_names(self) -> list[str]:
        """Every name whose health is set explicitly: "" (the whole server) and each service."""
        return ["", *self._services, *self.extra_health]

    # --- health, as a Watch hears it, for listeners in this process ----------------------------

    @property
    def served(self) -> int | None:
        """The whole server's health as a Watch of it would hear it now: None while no server
        answers (before its start, after its stop)."""
        return self._status if self._answering else None

    def watch_health(self, listener: HealthListener) -> Callable[[], None]:
        """Hear `served` now and at each change, on the event loop (call_soon: a listener never
        runs inside, nor can fail, the fault that changed it); the returned call stops it.
        What the web view of this process uses instead of a Watch stream over a socket per
        device (issue 18: cm384's 624 of them crowded the loop after the boot)."""
        self._listeners.add(listener)
        asyncio.get_running_loop().call_soon(listener, self.served)
        return lambda: self._listeners.discard(listener)

    def _tell(self) -> None:
        served = self.served
        if served == self._told:
            return
        self._told = served
        if self._listeners:
            loop = asyncio.get_running_loop()
            for listener in list(self._listeners):
                loop.call_soon(listener, served)

    # --- the server's life -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start, every service NOT_SERVING until the device says otherwise. Listeners
        hear the started server at that next set_serving (every starter makes one: a device's
        show_health), as a Watch reconnecting after a restart hears what it serves by then, not
        the NOT_SERVING it binds with."""
        self.security.check_bind(self.name, self.address)
        await self.set_serving(False)
        await _resolve(self.name, self.address)
        listen = listen_address(self.address)
        try:
            port = self.security.bind(self.server, listen)
        except RuntimeError:
            port = 0
        if port == 0:
            raise why_unbound(self.name, self.address, listen)
        await self.server.start()
        self._answering = True

    async def set_serving(self, serving: bool) -> None:
        status = SERVING if serving else NOT_SERVING
        for service in self.service_names:
            await self.health.set(service, status)
        self._status = status
        self._tell()

    async def stop_server(self, grace_s: float) -> None:
        """The server stops (its port free; calls in flight get `grace_s`): listeners hear it
        gone, as a Watch's connection ends."""
        self._answering = False
        self._tell()
        await self.server.stop(grace_s)

    async def stop(self, grace_s: float) -> None:
        await self.set_serving(False)
        await self.stop_server(grace_s)
