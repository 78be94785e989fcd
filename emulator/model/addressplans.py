"""Address plans: where each server of a topology listens, by launcher.

The topology names every device and service; a plan turns a server's ordinal, name and slot into
the address it binds and others dial: ports on one host (in-process), one loopback address each
(processes), or the device's name as a hostname (containers). topology.build takes one.
"""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.address import port_of
from cmemu.emulator.model.errors import InvalidArgumentError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_BASE_PORT = 21000  # below Linux's ephemeral range (32768+), so clients never squat on it
CONTAINER_PORT = 50051
HTTP_PORT = 8000  # a service's HTTP endpoint (the router's OpenAI API) beside its gRPC port
METRICS_PORT = 9464  # every process's Prometheus /metrics (the conventional OpenMetrics port)
# each launcher's own range of loopback addresses, 127.<octet>.x.y upwards, apart from the others'
# so that two emulators of different modes run side by side
PROCS_FIRST_OCTET = 10  # `cmemu up --mode procs`
COMPOSE_FIRST_OCTET = 60  # --from-compose, run as processes
ENGINE_FIRST_OCTET = 62  # the Docker engine: containers published on the host
K8S_FIRST_OCTET = 70  # --from-k8s, run as processes


@dataclass(frozen=True, kw_only=True)
class PortPlan:
    """In-process mode: one host, each device its own port (base_port + ordinal)."""

    host: str = DEFAULT_HOST
    base_port: int = DEFAULT_BASE_PORT

    def address(self, ordinal: int, name: str, slot: int) -> str:
        port = self.base_port + ordinal
        if not 0 < port < 65536:
            raise InvalidArgumentError(f"port {port} out of range; lower --base-port")
        return f"{self.host}:{port}"

    def http_address(self, ordinal: int, name: str, free_ordinal: int) -> str:
        """The next port after every server's: one host has no other room."""
        return self.address(free_ordinal, name, 0)

    def metrics_port(self, free_ordinal: int) -> int:
        """The next free port: one host, one process (in-process mode) serves /metrics there."""
        return port_of(self.address(free_ordinal, "", 0))


@dataclass(frozen=True, kw_only=True)
class LoopbackPlan:
    """Process mode: each device its own loopback address, one port, as a container owns an IP."""

    port: int = CONTAINER_PORT
    first_octet: int = PROCS_FIRST_OCTET  # another range keeps two emulators apart

    def address(self, ordinal: int, name: str = "", slot: int = 0) -> str:
        return f"{loopback_ip(ordinal, self.first_octet)}:{self.port}"

    def http_address(self, ordinal: int, name: str, free_ordinal: int) -> str:
        """The service's own address, on the HTTP port (as a container would serve it)."""
        return f"{loopback_ip(ordinal, self.first_octet)}:{HTTP_PORT}"

    def metrics_port(self, free_ordinal: int) -> int:
        """Each process on its own address, as a container is: one port for all."""
        return METRICS_PORT


def loopback_ip(ordinal: int, first_octet: int = PROCS_FIRST_OCTET) -> str:
    """The ordinal-th address of 127.<first_octet>.1.1 upwards, skipping .0 and .255 hosts."""
    high, low = divmod(ordinal, 250)
    mid, high = divmod(high, 250)
    if first_octet + mid > 254:
        raise InvalidArgumentError(f"ordinal {ordinal} exceeds the loopback plan")
    return f"127.{first_octet + mid}.{high + 1}.{low + 1}"


@dataclass(frozen=True, kw_only=True)
class DnsPlan:
    """Container mode: the device id is the hostname. One container per device: every device on
    CONTAINER_PORT. One container per node: its devices are network aliases of the node's
    container, each on CONTAINER_PORT plus its slot in the node."""

    per_node: bool = False

    def address(self, ordinal: int, name: str, slot: int) -> str:
        return f"{name}:{CONTAINER_PORT + (slot if self.per_node else 0)}"

    def http_address(self, ordinal: int, name: str, free_ordinal: int) -> str:
        return f"{name}:{HTTP_PORT}"

    def metrics_port(self, free_ordinal: int) -> int:
        return METRICS_PORT


AddressPlan = PortPlan | LoopbackPlan | DnsPlan
