"""The RDMA gateway's domain types: what its engine takes and returns, and what one gateway
asks of another (emulator/engines/peers.py `GatewayPeer`). The wire forms are
emulator/client/wire/gateway.py's; faults are the plane's own (emulator/model/rdmagraph.py
`RdmaFault`), a gateway-down one included."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.faults.gateway import gateway_down
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.ub import Op

AUTHORITY = 0  # the supernode whose gateway times the plane
DEFAULT_TOP = 20
# Wall seconds a gateway waits for the authority's answer about the plane (its faults, link
# statistics, routes): queries of an operator or a chaos tool, no verdict on a device, so wall.
# The data path's bound on a hung peer is emulated (scaleout.peer_timeout_s, GatewayState.answer).
PEER_TIMEOUT_S = 30.0
GATEWAY_DOWN = gateway_down.NAME  # the one kind a gateway holds itself (its module says why)


class QpState(enum.Enum):
    """A queue pair's state, as RDMA names them (RTR: the remote end known; RTS: connected)."""

    INIT = 1
    RTR = 2
    RTS = 3
    ERROR = 4


class RdmaOp(enum.Enum):
    """An operation on a connected queue pair; its value names it in counters and metrics."""

    WRITE = "write"
    READ = "read"
    SEND = "send"

    @property
    def ub(self) -> Op:
        """The UB operation that applies it on the NPU it lands on."""
        return _UB_OP[self]


_UB_OP = {RdmaOp.WRITE: Op.WRITE, RdmaOp.READ: Op.READ, RdmaOp.SEND: Op.SEND}


@dataclass(kw_only=True)
class Qp:
    """A queue pair of a gateway; the engine keeps it and hands out copies."""

    gateway: str
    qpn: int
    npu: str
    die: int
    created_ns: int
    state: QpState = QpState.INIT
    remote_gateway: str = ""
    remote_qpn: int = 0
    remote_npu: str = ""
    remote_die: int = 0
    ops: int = 0
    bytes: int = 0

    @property
    def local_die(self) -> str:
        return die_id(self.npu, self.die)

    @property
    def remote(self) -> str:
        return die_id(self.remote_npu, self.remote_die)


@dataclass(frozen=True, kw_only=True)
class OpRequest:
    """An operation asked of a queue pair (its op is the method's)."""

    qpn: int
    id: str = ""  # echoed; assigned when empty
    remote_offset: int = 0
    data: bytes = b""
    size: int = 0
    size_only: bool = False


@dataclass(frozen=True, kw_only=True)
class OpResult:
    """A completed operation: where the data went, when, and over which paths."""

    id: str
    op: RdmaOp
    qpn: int
    src: str
    dst: str
    size: int
    data: bytes
    issue_ns: int
    complete_ns: int
    path: tuple[str, ...]
    paths: int


@dataclass(frozen=True, kw_only=True)
class Landing:
    """An operation's bytes checked (`check_only`) or applied on an NPU by the gateway of its
    supernode."""

    op: RdmaOp
    npu: str
    offset: int
    data: bytes
    size: int
    size_only: bool
    check_only: bool
    src: str  # the issuing die (a SEND's message names its NPU)
    id: str
    issue_ns: int
    complete_ns: int = 0


@dataclass(frozen=True, kw_only=True)
class TimedFlow:
    """A flow the plane's authority timed: its completion instant and its route."""

    complete_ns: int
    path: tuple[str, ...]
    paths: int


@dataclass(frozen=True, kw_only=True)
class RouteInfo:
    path: tuple[str, ...]
    paths: int  # live ECMP paths
    switches: int
    latency_ns: int  # NICs and switches, one way, uncontended
    max_gb_s: float  # uncontended achievable rate


@dataclass(frozen=True, kw_only=True)
class LinkStat:
    link: str  # directed: "a>b"
    kind: str
    capacity_gb_s: float
    bytes: int
    utilization: float
    active_flows: int
    up: bool


@dataclass(frozen=True, kw_only=True)
class LinkStats:
    emulated_ns: int
    links: tuple[LinkStat, ...]
    active_flows: int
    completed_flows: int
    authority: str  # the gateway that timed them


@dataclass(frozen=True, kw_only=True)
class GatewayStats:
    gateway: str
    down: bool
    qps: int
    write_ops: int
    read_ops: int
    send_ops: int
    bytes_out: int
    bytes_in: int
    failed_ops: int
    emulated_ns: int


def shape(op: RdmaOp, request: OpRequest, inline_max: int) -> int:
    """The size an op moves, its request's shape checked (never touches state)."""
    if request.data and op is RdmaOp.READ:
        raise InvalidArgumentError("a READ carries no data; give size", field="data")
    if request.data and request.size_only:
        raise InvalidArgumentError("data and size_only are exclusive", field="size_only")
    size = request.size
    if request.data:
        if size not in (0, len(request.data)):
            raise InvalidArgumentError(
                f"size {size} differs from len(data) {len(request.data)}", field="size"
            )
        size = len(request.data)
    if size == 0:
        raise InvalidArgumentError("size must be > 0 (or data non-empty)", field="size")
    if op is not RdmaOp.READ and not request.data and not request.size_only:
        raise InvalidArgumentError(
            "WRITE and SEND carry data, or set size_only for a bulk transfer", field="data"
        )
    if not request.size_only and size > inline_max:
        raise InvalidArgumentError(
            f"{size} bytes exceed the {inline_max}-byte inline payload limit; use size_only",
            field="size",
            reason="PAYLOAD_TOO_LARGE",
        )
    return size
