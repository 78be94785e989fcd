"""The supernode-wide services, registered by kind: how each is made, when it starts, what it needs.

Every launcher reads this one table: the in-process supernode creates and starts the services it
hosts in wave order, `--mode procs` starts their processes in the same waves, and the compose
generator turns the waves into `depends_on`. A new service is one entry here (and its factory in
services/), never a branch in each launcher.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

from cmemu.emulator.engines.clock import TimeKeeper, Timeline
from cmemu.emulator.engines.events import EventSink
from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.model.topology import Service, ServiceKind, Topology
from cmemu.emulator.runtime import heap
from cmemu.services.host import ServiceHost
from cmemu.services.peers import Peers

# The start waves: the fabric before the devices (they hand it their first transaction as soon
# as they serve); the devices; EMS (its index is rebuilt from the memory pools) and the
# scheduler (it hands out devices) after them; the router (it asks both); the cluster manager
# last (it watches them all).
DEVICE_WAVE = 1


class ServiceState(Protocol):
    """What a launcher needs of a service's state: its background work and its end."""

    async def run(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class ServiceContext:
    """Everything a factory may need; each takes what it uses."""

    service: Service
    topology: Topology
    profile: HardwareProfile
    time: TimeKeeper  # this process's emulated time (the fabric serves its clock)
    peers: Peers
    events: EventSink | None
    data_dir: Path  # for services that keep files (EMS's SSD tier)
    rebuild_wait_s: float  # how long a rebuilding service waits for silent devices


Create = Callable[[ServiceContext], tuple[ServiceState, ServiceHost]]
Prepare = Callable[[ServiceState, ServiceContext], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """How a supernode-wide service is made and launched: its factory, start wave and limits."""

    create: Create
    wave: int
    mem_limit: str  # a compose container's memory limit
    keeps_files: bool = False  # gets a data directory (compose: a volume path)
    after_pools: bool = False  # compose: waits for every memory pool to be healthy
    # work between binding and SERVING, e.g. rebuilding an index: clients see NOT_SERVING
    prepare: Prepare | None = None


class StandardFactory(Protocol):
    """The factory shape of most services (services/scheduler.py `create_scheduler`, ...)."""

    def __call__(
        self,
        *,
        address: str,
        topology: Topology,
        profile: HardwareProfile,
        clock: Timeline,
        peers: Peers,
        events: EventSink | None,
    ) -> tuple[ServiceState, ServiceHost]: ...


def _standard(where: str) -> Create:
    """The factory `module:function`, imported when a service of its kind is first made: a
    process imports only the services it hosts (a device's process none of them), which keeps
    every `cmemu serve` and every CLI command from importing them all."""

    def make(ctx: ServiceContext) -> tuple[ServiceState, ServiceHost]:
        module, _, name = where.partition(":")
        create = cast(StandardFactory, getattr(importlib.import_module(module), name))
        return create(
            address=ctx.service.address,
            topology=ctx.topology,
            profile=ctx.profile,
            clock=ctx.time.timeline,
            peers=ctx.peers,
            events=ctx.events,
        )

    return make


def _ems(ctx: ServiceContext) -> tuple[ServiceState, ServiceHost]:
    from cmemu.services.ems import create_ems  # imported by the process hosting it

    return create_ems(
        address=ctx.service.address,
        topology=ctx.topology,
        profile=ctx.profile,
        clock=ctx.time.timeline,
        peers=ctx.peers,
        ssd_dir=ctx.data_dir,
        events=ctx.events,
    )


def _fabric(ctx: ServiceContext) -> tuple[ServiceState, ServiceHost]:
    from cmemu.emulator.engines.fabric.engine import FabricEngine
    from cmemu.services.fabric import fabric_server  # imported by the process hosting it

    engine = FabricEngine(
        topology=ctx.topology,
        profile=ctx.profile,
        clock=ctx.time.timeline,
        peers=ctx.peers,
        events=ctx.events,
    )
    ctx.peers.host_fabric(engine)
    _, host = fabric_server(engine, ctx.time, address=ctx.service.address)
    heap.after_starts(engine.warm)  # its link graph once the launch is ready, or at first use
    return engine, host


async def _ems_rebuild(state: ServiceState, ctx: ServiceContext) -> None:
    from cmemu.emulator.engines.ems import EmsState  # imported by the process hosting it

    assert isinstance(state, EmsState)
    await state.rebuild(ctx.rebuild_wait_s)


async def _router_http(state: ServiceState, ctx: ServiceContext) -> None:
    from cmemu.services.router import RouterState  # imported by the process hosting it

    assert isinstance(state, RouterState)
    await state.open_http()  # bound now; served once this process's starts end
    heap.after_starts(state.serve_http)


SERVICE_SPECS: dict[ServiceKind, ServiceSpec] = {
    ServiceKind.FABRIC: ServiceSpec(create=_fabric, wave=0, mem_limit="2g"),
    ServiceKind.EMS: ServiceSpec(
        create=_ems,
        wave=2,
        mem_limit="2g",
        keeps_files=True,
        after_pools=True,
        prepare=_ems_rebuild,
    ),
    ServiceKind.SCHEDULER: ServiceSpec(
        create=_standard("cmemu.services.scheduler:create_scheduler"), wave=2, mem_limit="512m"
    ),
    ServiceKind.ROUTER: ServiceSpec(
        create=_standard("cmemu.services.router:create_router"),
        wave=3,
        mem_limit="2g",
        prepare=_router_http,
    ),
    # after the devices: it lands RDMA bytes through their UB Deliver
    ServiceKind.GATEWAY: ServiceSpec(
        create=_standard("cmemu.services.gateway:create_gateway"), wave=2, mem_limit="1g"
    ),
    # last: it heartbeats every device and calls the scheduler and the router
    ServiceKind.MANAGER: ServiceSpec(
        create=_standard("cmemu.services.manager:create_manager"), wave=4, mem_limit="1g"
    ),
}
WAVES = 1 + max(spec.wave for spec in SERVICE_SPECS.values())


def spec_of(kind: ServiceKind) -> ServiceSpec:
    return SERVICE_SPECS[kind]
