"""`cmemu serve`: one container's (or one process's) part of a topology, until a signal.

The command line is built here once, for the process launcher and the compose generator alike,
so a container and a process of `--mode procs` run exactly the same thing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from emulator.model.errors import InvalidArgumentError, NotFoundError
from emulator.model.topology import ServiceKind, Topology
from emulator.runtime.inprocess import InProcessSupernode

EPOCH_ENV = "CMEMU_EPOCH"
BROKER_ENV = "CMEMU_BROKER"
SSD_ENV = "CMEMU_EMS_SSD"
DEFAULT_REBUILD_WAIT_S = 30.0
DEFAULT_SERVE_DRAIN_S = 0.5

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
    if kind == "service" and name == ServiceKind.EMS.value:
        argv += ["--ssd-dir", ems_ssd_dir]
    return argv


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    topology_path: Path
    kind: ServeKind
    name: str
    drain_s: float = DEFAULT_SERVE_DRAIN_S
    ssd_dir: Path | None = None  # EMS only; default $CMEMU_EMS_SSD, else a scratch directory
    rebuild_wait_s: float = DEFAULT_REBUILD_WAIT_S  # EMS only: how long silent pools may be


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


def _with_epoch(topology: Topology) -> Topology:
    if topology.epoch_wall_s is not None:
        return topology
    epoch = os.environ.get(EPOCH_ENV)
    if not epoch:
        raise InvalidArgumentError(
            f"the topology has no epoch and ${EPOCH_ENV} is unset: every process of one "
            "emulator must share the instant emulated time started"
        )
    try:
        return dataclasses.replace(topology, epoch_wall_s=float(epoch))
    except ValueError:
        raise InvalidArgumentError(f"${EPOCH_ENV}={epoch!r} is not a number of seconds") from None


async def serve(options: ServeOptions, stop: asyncio.Event) -> None:
    """Serve until `stop` is set, then turn NOT_SERVING, drain and stop."""
    try:
        text = await asyncio.to_thread(options.topology_path.read_text)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read topology {options.topology_path}: {exc}") from exc
    topology = _with_epoch(Topology.from_json(text))
    ssd = options.ssd_dir or (Path(os.environ[SSD_ENV]) if os.environ.get(SSD_ENV) else None)
    async with InProcessSupernode(
        topology,
        hosted=hosted(topology, options.kind, options.name),
        drain_s=options.drain_s,
        broker=os.environ.get(BROKER_ENV) or topology.broker,
        ems_ssd_dir=ssd,
        ems_rebuild_wait_s=options.rebuild_wait_s,
    ):
        await stop.wait()
