"""`cmemu serve`: one container's (or one process's) part of a topology, until a signal.

The command line is built here once, for the process launcher and the compose generator alike,
so a container and a process of `--mode procs` run exactly the same thing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.credentials import ANONYMOUS, Credentials
from cmemu.emulator.client.fabric import ClockInfo, FabricClient
from cmemu.emulator.client.status import code_name
from cmemu.emulator.model.errors import (
    EmulatorError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from cmemu.emulator.model.naming import parse_service
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.runtime.security import Security
from cmemu.emulator.runtime.stopping import unless_stopped

EPOCH_ENV = "CMEMU_EPOCH"
BROKER_ENV = "CMEMU_BROKER"
SSD_ENV = "CMEMU_EMS_SSD"
DEFAULT_REBUILD_WAIT_S = 30.0
DEFAULT_SERVE_DRAIN_S = 0.5
DEFAULT_CLOCK_WAIT_S = 60.0
CLOCK_RETRY_S = 0.2
GZIP_MAGIC = b"\x1f\x8b"

ServeKind = Literal["device", "node", "service"]
SERVE_KINDS: tuple[ServeKind, ...] = ("device", "node", "service")
Per = Literal["device", "node"]  # one process (or container) per device, or per node
PER: tuple[Per, ...] = ("device", "node")


def serve_argv(
    program: str,
    topology_path: str,
    kind: ServeKind,
    name: str,
    *,
    ems_ssd_dir: str,
    log_level: str | None = None,
) -> list[str]:
    """The command that serves `name` (a device, a node or a service) of a topology document.
    EMS alone keeps files of its own (the SSD tier), in `ems_ssd_dir`."""
    argv = [program, *(["--log-level", log_level] if log_level else [])]
    argv += ["serve", "--topology", topology_path, f"--{kind}", name]
    if kind == "service" and parse_service(name).kind == ServiceKind.EMS.value:
        argv += ["--ssd-dir", ems_ssd_dir]
    return argv


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """What `cmemu serve` runs: the topology file and the device or service it serves."""

    topology_path: Path
    kind: ServeKind
    name: str
    drain_s: float = DEFAULT_SERVE_DRAIN_S
    ssd_dir: Path | None = None  # EMS only; default $CMEMU_EMS_SSD, else a scratch directory
    rebuild_wait_s: float = DEFAULT_REBUILD_WAIT_S  # EMS only: how long silent pools may be
    clock_wait_s: float = DEFAULT_CLOCK_WAIT_S  # without an epoch: how long to ask the fabric
    security: Security | None = None  # token, TLS, --insecure; default from $CMEMU_TOKEN_FILE...


def hosted(topology: Topology, kind: ServeKind, name: str) -> list[str]:
    """The ids of the servers that `cmemu serve --KIND NAME` runs."""
    if kind == "device":
        return [topology.device(name).id]
    if kind == "node":
        devices = topology.in_node(name)
        if not devices:
            raise NotFoundError(
                f"no node {name!r}; nodes are {topology.nodes[0]}..{topology.nodes[-1]}"
            )
        return [d.id for d in devices]
    services = {x.id for x in topology.services}
    if name not in services:
        raise NotFoundError(f"no service {name!r}; services: {', '.join(sorted(services))}")
    return [name]


def _env_epoch() -> float | None:
    epoch = os.environ.get(EPOCH_ENV)
    if not epoch:
        return None
    try:
        return float(epoch)
    except ValueError:
        raise InvalidArgumentError(f"${EPOCH_ENV}={epoch!r} is not a number of seconds") from None


async def clock_from_fabric(
    clients: Clients, wait_s: float, address: str | None = None
) -> ClockInfo:
    """The clock of the fabric at `address` (default: the topology's own), asked until it
    answers (it may still be starting), for `wait_s`."""
    address = address or clients.topology.service(ServiceKind.FABRIC).address
    fabric = FabricClient(clients)
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        try:
            return await fabric.clock(deadline_s=max(0.1, min(2.0, left)), address=address)
        except EmulatorError as exc:
            if time.monotonic() >= deadline:
                raise UnavailableError(
                    f"no epoch: the topology has none, ${EPOCH_ENV} is unset, and the fabric "
                    f"at {address} did not tell its clock within {wait_s:g} s "
                    f"({code_name(exc)}: {exc})"
                ) from None
        await asyncio.sleep(CLOCK_RETRY_S)


async def with_epoch(
    topology: Topology,
    kind: ServeKind,
    name: str,
    wait_s: float,
    credentials: Credentials = ANONYMOUS,
) -> Topology:
    """Every process of one emulator shares the instant emulated time started: from the topology
    document, else $CMEMU_EPOCH, else the fabric's. The fabric itself, given none, takes now;
    with several supernodes, the fabric of each other supernode asks sn0's."""
    if topology.epoch_wall_s is not None:
        return topology
    epoch = _env_epoch()
    if epoch is not None:
        return dataclasses.replace(topology, epoch_wall_s=epoch)
    address = None
    if kind == "service" and name == topology.service(ServiceKind.FABRIC).id:
        if topology.scaleout is None or topology.index == 0:
            return dataclasses.replace(topology, epoch_wall_s=time.time())
        address = topology.scaleout.clock
    clients = Clients(topology, credentials)
    try:
        clock = await clock_from_fabric(clients, wait_s, address)
    finally:
        await clients.close()
    return dataclasses.replace(topology, epoch_wall_s=clock.epoch_wall_s)


def read_document(path: Path) -> str:
    """A topology document's text, gzipped or not (a Kubernetes ConfigMap holds 1 MiB: the
    manifests carry cm384's 1.2 MB document gzipped, emulator/runtime/k8sgen.py)."""
    data = path.read_bytes()
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise InvalidArgumentError(f"topology {path}: a broken gzip file: {exc}") from exc
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"topology {path} is not text: {exc}") from exc


def load_topology(text: str, kind: ServeKind) -> Topology:
    """The document as a process serving `kind` holds it: a device's or a node's process never
    routes (the fabric does, and the services that read the link graph are services), so it
    leaves the links out: on cm384, 8 MB less PSS and about 0.2 CPU s less of each of its 48
    node processes (tests/runtime/test_serve_topology.py)."""
    return Topology.from_json(text, links=kind == "service")


async def serve(options: ServeOptions, stop: asyncio.Event) -> None:
    """Serve until `stop` is set, then turn NOT_SERVING, drain and stop."""
    try:
        text = await asyncio.to_thread(read_document, options.topology_path)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read topology {options.topology_path}: {exc}") from exc
    topology = load_topology(text, options.kind)
    security = options.security or Security.from_env(os.environ)
    guard = security.server()
    for server_id in hosted(topology, options.kind, options.name):  # fail before any wait
        guard.check_bind(server_id, _address(topology, server_id))
    topology = await with_epoch(
        topology, options.kind, options.name, options.clock_wait_s, security.credentials()
    )
    ssd = options.ssd_dir or (Path(os.environ[SSD_ENV]) if os.environ.get(SSD_ENV) else None)
    supernode = InProcessSupernode(
        topology,
        hosted=hosted(topology, options.kind, options.name),
        drain_s=options.drain_s,
        broker=os.environ.get(BROKER_ENV) or topology.broker,
        ems_ssd_dir=ssd,
        ems_rebuild_wait_s=options.rebuild_wait_s,
        security=security,
        process=options.name,
    )
    try:
        # a process stopped while it waits for the owner of time or for its pools (a container
        # stopped during its start) stops then, not after the start's own timeouts
        if await unless_stopped(supernode.start(), stop):
            await stop.wait()
    finally:
        await supernode.stop()


def _address(topology: Topology, server_id: str) -> str:
    for service in topology.services:
        if service.id == server_id:
            return service.address
    return topology.device(server_id).address
