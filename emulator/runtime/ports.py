"""Every address an instance opens, known and checked before anything binds (issue 21, 12 and 15).

An in-process instance owns one block of ports from `--base-port`: every gRPC server, each
service's HTTP endpoint, the /metrics, then the embedded broker and the web view (when they are
the instance's own and at their defaults). A procs instance owns the loopback addresses
127.<first octet>.*: its servers on `--port`, HTTP and /metrics on their fixed ports, and the
broker and the web view on `--port` of 127.<first octet>.0.1 and .0.2 (no server has a `.0.`
address: loopback_ip starts at .1.1). `cmemu up`
binds each address once, here, before it starts anything: a clash is one message naming the
address, what of the instance wanted it and, when /proc says, the process that holds it, in a
second rather than after every server's retries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cmemu.emulator.model.address import parse_address
from cmemu.emulator.model.addressplans import LoopbackPlan, PortPlan
from cmemu.emulator.model.errors import AddressError, AddressInUseError, InvalidArgumentError
from cmemu.emulator.model.topology import Topology, metrics_address
from cmemu.emulator.runtime.launchoptions import EMBEDDED, InProcess, LaunchOptions, Procs
from cmemu.emulator.runtime.metricserver import first_server
from cmemu.emulator.runtime.procslaunch import proc_waves

EXTRAS = ("the embedded broker", "the web view")  # after the servers, in this order
PROC = Path("/proc")


class BlockError(InvalidArgumentError):
    """The block cannot hold the instance (a command-line mistake: `cmemu up` exits 2)."""


@dataclass(frozen=True, kw_only=True)
class Block:
    """What an instance binds: (what, HOST:PORT) each, and where its broker and web view go
    (None: not the block's, e.g. `--broker none` or an explicit `--ui`)."""

    bindings: tuple[tuple[str, str], ...]
    broker: str | None = None
    ui: str | None = None
    first: int | None = None  # ports plan: the block's first and last port
    last: int | None = None
    loopback: str | None = None  # loopback plan: "127.<octet>"

    def record(self) -> dict[str, object]:
        """The state file's `ports` record: the block (the addresses are named in place)."""
        if self.loopback is not None:
            return {"loopback": self.loopback, "size": len(self.bindings)}
        return {"first": self.first, "last": self.last, "size": len(self.bindings)}


def loopback_prefix(text: str) -> int:
    """`127.N` (or `127.N.0.0`): the first octet N of a procs instance's loopback addresses; a
    BlockError unless it is inside 127.0.0.0/8 with room (N from 1 to 254)."""
    parts = text.split(".")
    if len(parts) == 2:
        parts += ["0", "0"]
    try:
        address = ipaddress.IPv4Address(".".join(parts))
    except ValueError:
        raise BlockError(f"--loopback {text!r}: 127.N is wanted (N from 1 to 254)") from None
    octets = address.packed
    if octets[0] != 127 or not 1 <= octets[1] <= 254 or octets[2:] != b"\0\0":
        raise BlockError(
            f"--loopback {text!r}: not a 127.N block inside 127.0.0.0/8 (N from 1 to 254)"
        )
    return octets[1]


def block_of(options: LaunchOptions, ui: str | None) -> Block:
    """Every address `options` binds, with the broker and web view (`ui` the `--ui` given, or
    None for the default) placed in the instance's block. Modes that run files (compose, k8s,
    docker) bring their own addresses: only the web view and the broker are placed there."""
    if not isinstance(options.mode, InProcess | Procs):
        return Block(bindings=())
    plan = options.plan
    try:
        supernodes = options.supernodes()
    except InvalidArgumentError:
        if isinstance(plan, PortPlan):
            _size(options, plan.base_port)  # past 65535: says how far, else raises as it was
        raise
    bindings = [pair for topology in supernodes for pair in _servers(options, topology)]
    embedded = options.broker == EMBEDDED
    if isinstance(plan, PortPlan):
        first = plan.base_port
        last = first + _size(options, first, len(bindings)) - 1
        host = plan.host
        broker = f"{host}:{last - 1}" if embedded else None
        at = f"{host}:{last}" if ui is None else None
        return Block(
            bindings=_with(bindings, broker, at), broker=broker, ui=at, first=first, last=last
        )
    if isinstance(plan, LoopbackPlan):
        net = f"127.{plan.first_octet}.0"
        broker = f"{net}.1:{plan.port}" if embedded else None
        at = f"{net}.2:{plan.port}" if ui is None else None
        return Block(
            bindings=_with(bindings, broker, at),
            broker=broker,
            ui=at,
            loopback=f"127.{plan.first_octet}",
        )
    return Block(bindings=tuple(bindings))


def _size(options: LaunchOptions, first: int, servers: int | None = None) -> int:
    """The ports of the block from `first` (`servers`: those of the servers, when known); a
    BlockError when it runs past 65535."""
    if servers is None:  # sized on a block that fits: a topology past 65535 cannot be built
        mode = options.mode
        assert isinstance(mode, InProcess | Procs) and isinstance(mode.plan, PortPlan)
        at_one = dataclasses.replace(mode, plan=dataclasses.replace(mode.plan, base_port=1))
        at_one_options = dataclasses.replace(options, mode=at_one)
        servers = sum(len(_servers(at_one_options, t)) for t in at_one_options.supernodes())
    size = servers + len(EXTRAS)
    if first + size - 1 > 65535:
        raise BlockError(
            f"--base-port {first}: the instance needs {size} ports, {first}-{first + size - 1}, "
            f"past 65535: give a --base-port of at most {65536 - size}"
        )
    return size


def _with(
    bindings: list[tuple[str, str]], broker: str | None, ui: str | None
) -> tuple[tuple[str, str], ...]:
    extra = [(what, at) for what, at in zip(EXTRAS, (broker, ui), strict=True) if at]
    return (*bindings, *extra)


def _servers(options: LaunchOptions, topology: Topology) -> list[tuple[str, str]]:
    """(what, address) of every socket the supernode's servers open."""
    out = [(d.id, d.address) for d in topology.devices]
    out += [(x.id, x.address) for x in topology.services]
    out += [
        (f"{x.id}'s HTTP endpoint", x.http_address) for x in topology.services if x.http_address
    ]
    if topology.metrics_port is None:
        return out
    if not isinstance(options.mode, Procs):  # in process: one /metrics per supernode
        first = first_server(topology, {d.id for d in topology.devices})
        where = metrics_address(topology, first[1]) if first else None
        return out + ([(f"{topology.supernode}'s /metrics", where)] if where else [])
    for wave in proc_waves(topology, Path("topology.json"), options.mode.per):
        for spec in wave:  # each process serves /metrics on its first server's host
            first = first_server(topology, spec.servers)
            where = metrics_address(topology, first[1]) if first else None
            if where:
                out.append((f"the /metrics of {spec.name}'s process", where))
    return out


def check_free(block: Block) -> None:
    """Bind every address of the block once and let go: AddressInUseError for the first taken,
    naming the process that holds it when /proc tells (the same user's processes); an
    AddressError when the system refuses an address for another cause."""
    for what, address in block.bindings:
        at = parse_address(address, any_port=True)
        host, port = at.host, at.port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # as the servers do: a port whose last connection is in TIME_WAIT is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise AddressError(
                        what, address, exc.strerror or str(exc), reason="ADDRESS_UNUSABLE"
                    ) from exc
                raise PortTakenError(what, address, holder(port)) from None


class PortTakenError(AddressInUseError):
    """A port of the block is taken: by whom, when /proc says."""

    def __init__(self, what: str, address: str, held_by: str | None) -> None:
        super().__init__(what, address)
        who = f"held by {held_by}" if held_by else "held by a process this user cannot see"
        self.args = (f"{self.args[0]} ({who}); nothing was started",)


def holder(port: int, proc: Path = PROC) -> str | None:
    """`pid N (command line)` of a process listening on TCP `port`, from /proc/net/tcp{,6}
    and the socket inodes of /proc/*/fd (readable for this user's processes only)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                local, status, inode = fields[1], fields[3], fields[9]
                if status == "0A" and int(local.rpartition(":")[2], 16) == port:
                    inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return f"pid {entry.name} ({_command(entry)})"
    return None


def _command(entry: Path) -> str:
    try:
        raw = (entry / "cmdline").read_bytes()
    except OSError:
        return "?"
    # one line whatever the arguments hold (a `python -c` program has newlines)
    text = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
    return text if len(text) <= 200 else text[:197] + "..."


def with_block(options: LaunchOptions, block: Block) -> LaunchOptions:
    """The options with the embedded broker at its place in the block."""
    return dataclasses.replace(options, broker_address=block.broker)
