"""Nobody changes state anonymously (DESIGN principle 11): the server side.

- `ACCESS`: every RPC of the wire contract, by full method name, classified WRITE (changes state:
  needs the bearer token when one is configured) or READ (open). A test walks the generated
  descriptors so that a new RPC cannot slip through unclassified; an RPC missing from the table
  anyway is treated as WRITE (closed by default). Health and reflection are open.
- `TokenInterceptor`: a grpc.aio server interceptor answering UNAUTHENTICATED to a WRITE call
  without `authorization: Bearer <token>` metadata, or with a wrong token (compared in constant
  time), with an ErrorInfo (TOKEN_MISSING, TOKEN_INVALID) like every other status.
- `ServerSecurity`: what a ServiceHost is built with: the token, the TLS certificate and key, and
  whether binding beyond loopback without a token is allowed (`--insecure`).
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cmemu.emulator.client.errors import DOMAIN
from cmemu.emulator.model.address import host_of
from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.tenants import Keys

if TYPE_CHECKING:  # generic in the stubs only
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

AUTH_HEADER = "authorization"
SCHEME = "bearer"


class Access(enum.Enum):
    READ = "read"  # open to anyone who can reach the server
    WRITE = "write"  # changes state: needs the token when one is configured


R, W = Access.READ, Access.WRITE

# One line per RPC. A READ that is cheap to authorise stays open anyway: reads are open.
ACCESS: dict[str, Access] = {
    "/cmemu.v1.Device/GetInfo": R,
    "/cmemu.v1.Device/GetTelemetry": R,
    "/cmemu.v1.Device/AllocateRegion": W,
    "/cmemu.v1.Device/FreeRegion": W,
    "/cmemu.v1.Device/ListRegions": R,
    "/cmemu.v1.Device/GetFaultState": R,
    "/cmemu.v1.Device/SetFaultState": W,
    "/cmemu.v1.Device/InjectFault": W,
    "/cmemu.v1.Device/ClearFault": W,
    "/cmemu.v1.Device/ListFaults": R,
    "/cmemu.v1.Device/WatchLiveness": R,
    # the whole of Submit and Deliver, whatever the op: a READ is as cheap to authorise as a
    # WRITE, and one rule per method is one the table can state
    "/cmemu.v1.UnifiedBus/Submit": W,
    "/cmemu.v1.UnifiedBus/Deliver": W,
    "/cmemu.v1.UnifiedBus/Receive": W,  # drains the messages it returns
    "/cmemu.v1.Npu/SubmitKernel": W,  # occupies a die's queue in emulated time
    "/cmemu.v1.Cpu/GetNuma": R,
    "/cmemu.v1.MemoryPool/GetPool": R,
    "/cmemu.v1.Fabric/Transfer": W,
    "/cmemu.v1.Fabric/Collective": W,  # loads links, as Transfer does
    "/cmemu.v1.Fabric/Route": R,
    "/cmemu.v1.Fabric/InjectFault": W,
    "/cmemu.v1.Fabric/ClearFault": W,
    "/cmemu.v1.Fabric/ListFaults": R,
    "/cmemu.v1.Fabric/GetLinkStats": R,
    "/cmemu.v1.Fabric/WatchLinkStats": R,
    "/cmemu.v1.Fabric/GetClock": R,
    "/cmemu.v1.Fabric/ListCollectiveArrivals": R,
    "/cmemu.v1.Fabric/SyncClock": W,  # a report slows emulated time for every process
    "/cmemu.v1.Ems/Put": W,
    "/cmemu.v1.Ems/Get": R,
    "/cmemu.v1.Ems/Delete": W,
    "/cmemu.v1.Ems/Exists": R,
    "/cmemu.v1.Ems/BatchPut": W,
    "/cmemu.v1.Ems/BatchGet": R,
    "/cmemu.v1.Ems/BatchDelete": W,
    "/cmemu.v1.Ems/BatchExists": R,
    "/cmemu.v1.Ems/PrefixKeys": R,
    "/cmemu.v1.Ems/MatchPrefix": R,
    "/cmemu.v1.Ems/Stat": R,
    "/cmemu.v1.Ems/List": R,
    "/cmemu.v1.Ems/PutStream": W,
    "/cmemu.v1.Ems/GetStream": R,
    "/cmemu.v1.Scheduler/Allocate": W,
    "/cmemu.v1.Scheduler/Release": W,
    "/cmemu.v1.Scheduler/ListAllocations": R,
    "/cmemu.v1.Scheduler/GetAllocation": R,
    "/cmemu.v1.Scheduler/Replace": W,
    "/cmemu.v1.Scheduler/MarkFailed": W,
    "/cmemu.v1.Scheduler/MarkHealthy": W,
    "/cmemu.v1.Scheduler/GetSpares": R,
    "/cmemu.v1.Scheduler/SetSpares": W,
    "/cmemu.v1.Scheduler/ListPolicies": R,
    "/cmemu.v1.Scheduler/StartDayPlan": W,
    "/cmemu.v1.Scheduler/GetDayPlan": R,
    "/cmemu.v1.Scheduler/StopDayPlan": W,
    "/cmemu.v1.Router/Deploy": W,
    "/cmemu.v1.Router/Undeploy": W,
    "/cmemu.v1.Router/ListDeployments": R,
    "/cmemu.v1.Router/GetDeployment": R,
    "/cmemu.v1.Router/GetStats": R,
    "/cmemu.v1.Router/GetUsage": R,  # what /metrics shows too
    "/cmemu.v1.Scheduler/WatchAllocations": R,
    "/cmemu.v1.ClusterManager/GetStatus": R,
    "/cmemu.v1.ClusterManager/ListIncidents": R,
    "/cmemu.v1.ClusterManager/SetMode": W,
    "/cmemu.v1.Training/Start": W,
    "/cmemu.v1.Training/Get": R,
    "/cmemu.v1.Training/List": R,
    "/cmemu.v1.Training/Stop": W,
    "/cmemu.v1.Gateway/CreateQp": W,
    "/cmemu.v1.Gateway/ConnectQp": W,
    "/cmemu.v1.Gateway/DestroyQp": W,
    "/cmemu.v1.Gateway/ListQps": R,
    "/cmemu.v1.Gateway/Write": W,
    "/cmemu.v1.Gateway/Read": W,  # loads links and a device, as Fabric/Transfer does
    "/cmemu.v1.Gateway/Send": W,
    "/cmemu.v1.Gateway/GetLinkStats": R,
    "/cmemu.v1.Gateway/GetStats": R,
    "/cmemu.v1.Gateway/Route": R,
    "/cmemu.v1.Gateway/InjectFault": W,
    "/cmemu.v1.Gateway/ClearFault": W,
    "/cmemu.v1.Gateway/ListFaults": R,
    "/cmemu.v1.Gateway/AcceptQp": W,  # gateways only, with the token they all hold
    "/cmemu.v1.Gateway/Land": W,
    "/cmemu.v1.Gateway/TimeFlow": W,
}

# Whole services open to all: health checks and reflection (grpcurl's list and describe).
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
)


def access(method: str) -> Access:
    """How `method` ("/package.Service/Method") is guarded; WRITE when it is unknown."""
    known = ACCESS.get(method)
    if known is not None:
        return known
    service = method.lstrip("/").split("/", 1)[0]
    return R if service in OPEN_SERVICES else W


def bearer_value(token: str) -> str:
    """The `authorization` metadata value that carries `token`."""
    return f"Bearer {token}"


def _status(message: str, reason: str) -> grpc.Status:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN))
    return rpc_status.to_status(
        status_pb2.Status(
            code=grpc.StatusCode.UNAUTHENTICATED.value[0], message=message, details=[info]
        )
    )


MISSING = _status(
    "this call changes state and needs `authorization: Bearer <token>` metadata "
    "(cmemu clients read the token beside the state file)",
    "TOKEN_MISSING",
)
INVALID = _status("the bearer token is not this emulator's", "TOKEN_INVALID")


def _denying(
    handler: grpc.RpcMethodHandler[Any, Any], status: grpc.Status
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as `handler` that only answers `status`."""

    async def abort(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(status.code, status.details, status.trailing_metadata)

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await abort(context)

    async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await abort(context)
        yield  # pragma: no cover  (abort raises)

    behaviour: Callable[..., Any] = streaming if handler.response_streaming else unary
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _presented(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes | None:
    """The token of the `authorization: Bearer <token>` metadata, if any."""
    for key, value in metadata or ():
        if key == AUTH_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            return token.strip().encode() if scheme.lower() == SCHEME else b""
    return None


class TokenInterceptor(_ServerInterceptor):
    """UNAUTHENTICATED for every WRITE call that does not carry the token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or access(handler_call_details.method) is R:
            return handler
        presented = _presented(handler_call_details.invocation_metadata)
        if presented is None:
            return _denying(handler, MISSING)
        if not hmac.compare_digest(presented, self._token):
            return _denying(handler, INVALID)
        return handler


# --- what a server is built with -----------------------------------------------------------------


class InsecureBindError(PreconditionError):
    """A server would listen beyond loopback with no token to guard its state."""

    default_reason = "INSECURE_BIND"

    def __init__(self, name: str, address: str) -> None:
        self.address = address
        super().__init__(
            f"refusing to bind {name} to {address}: beyond loopback, anyone who reaches it "
            "could change its state. Give a token (cmemu up --token-file FILE; "
            "$CMEMU_TOKEN_FILE for cmemu serve), or --insecure to accept that",
            subject=name,
        )


def is_loopback(address: str) -> bool:
    """Whether "host:port" listens on loopback only (127.0.0.0/8, ::1, localhost). Wildcards
    (0.0.0.0, [::]) and DNS names reach beyond it."""
    host = host_of(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, kw_only=True)
class ServerSecurity:
    """How a server guards itself. The default: no token, plaintext, loopback only."""

    token: str | None = None
    cert_pem: bytes | None = field(default=None, repr=False)  # TLS: the chain, then the key
    key_pem: bytes | None = field(default=None, repr=False)
    insecure: bool = False  # allow binding beyond loopback without a token
    keys: Keys | None = field(default=None, repr=False)  # the HTTP endpoint's tenants

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise ValueError("a TLS certificate goes with its key")

    @property
    def tls(self) -> bool:
        return self.cert_pem is not None

    def interceptors(self) -> list[grpc.aio.ServerInterceptor[Any, Any]]:
        return [TokenInterceptor(self.token)] if self.token else []

    def check_bind(self, name: str, address: str) -> None:
        """InsecureBindError when `address` is beyond loopback and nothing guards it."""
        if not (self.token or self.insecure or is_loopback(address)):
            raise InsecureBindError(name, address)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The same certificate for an HTTP server (the OpenAI endpoint, /metrics, the web
        view), or None without TLS. The ssl module loads a chain only from files: the PEM
        bytes pass through a private temporary directory that is gone on return."""
        if self.cert_pem is None or self.key_pem is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="cmemu-tls-") as directory:
            cert, key = f"{directory}/cert.pem", f"{directory}/key.pem"
            with open(cert, "wb") as out:
                out.write(self.cert_pem)
            with open(key, "wb") as out:
                out.write(self.key_pem)
            context.load_cert_chain(cert, key)
        return context

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        """Add the listening port (TLS when there is a certificate); the port, 0 on failure."""
        if self.cert_pem is None or self.key_pem is None:
            return server.add_insecure_port(address)
        credentials = grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)])
        return server.add_secure_port(address, credentials)


OPEN = ServerSecurity()
