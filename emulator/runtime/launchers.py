"""Which launcher starts which mode, and the in-process one: every supernode of the preset in
this process. `Supernode.start` comes here; the launchers of processes are in procslaunch.py,
Docker's in enginelaunch.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import assert_never

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.engines.clock import TimeKeeper
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.runtime.inprocess import InProcessSupernode
from cmemu.emulator.runtime.launchoptions import (
    Compose,
    Docker,
    InProcess,
    K8s,
    LaunchOptions,
    Procs,
    StartInterrupted,
    report,
)
from cmemu.emulator.runtime.launchsetup import broker_for, security_for, servers_of
from cmemu.emulator.runtime.procs import Running
from cmemu.emulator.runtime.procslaunch import launch_compose, launch_k8s, launch_procs
from cmemu.emulator.runtime.supernode import Supernode


@contextlib.asynccontextmanager
async def start(
    options: LaunchOptions,
    *,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
) -> AsyncIterator[Supernode]:
    """`Supernode.start`: the mode's launcher, then the clients' close on exit."""
    async with contextlib.AsyncExitStack() as stack:
        sn = await stack.enter_async_context(_launcher(options, stop, on_death))
        if stop.is_set():  # while starting (in process, a start runs to its end first)
            raise StartInterrupted("stopped while starting")
        stack.push_async_callback(sn.clients.close)
        yield sn


def _launcher(
    options: LaunchOptions, stop: asyncio.Event, on_death: Callable[[Running], None] | None
) -> contextlib.AbstractAsyncContextManager[Supernode]:
    """The launcher of the options' mode, given that mode's own options."""
    mode = options.mode
    match mode:
        case InProcess():
            return _inprocess(options, mode, stop, on_death)
        case Procs():
            return launch_procs(options, mode, stop, on_death)
        case Compose():
            return launch_compose(options, mode, stop, on_death)
        case K8s():
            return launch_k8s(options, mode, stop, on_death)
        case Docker():
            return _docker(options, mode, stop, on_death)
    assert_never(mode)


@contextlib.asynccontextmanager
async def _inprocess(
    options: LaunchOptions,
    mode: InProcess,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
) -> AsyncIterator[Supernode]:
    """Every supernode of the preset in this process, one InProcessSupernode each, sharing
    the broker, the token and emulated time (one epoch: the scale-out plane times flows between
    them)."""
    supernodes = await asyncio.to_thread(options.supernodes)
    epoch = time.time()
    supernodes = tuple(dataclasses.replace(t, epoch_wall_s=epoch) for t in supernodes)
    total = sum(len(servers_of(t)) for t in supernodes)
    report(options, f"starting {total} servers in process", 0, total)
    # one emulated time for every supernode of this process, owned here
    clock = Clock(time_scale=options.time_scale, epoch_wall_s=epoch)
    profile = dataclasses.replace(options.profile.clock, dilation=options.dilation)
    keeper = TimeKeeper(clock, profile=profile, process="inprocess", owner=True)
    async with contextlib.AsyncExitStack() as stack:
        running = asyncio.ensure_future(keeper.run())
        stack.callback(keeper.close)
        stack.push_async_callback(_cancelled, running)
        security = await stack.enter_async_context(security_for(options, *supernodes))
        first = await stack.enter_async_context(broker_for(options, supernodes[0], security))
        started: list[InProcessSupernode] = []
        for topology in supernodes:  # one broker for them all
            with_broker = dataclasses.replace(topology, broker=first.broker)
            # EMS's SSD tier lives as long as this process: its DRAM copies die with it anyway
            local = await stack.enter_async_context(
                InProcessSupernode(
                    with_broker,
                    profile=options.profile,
                    drain_s=options.drain_s,
                    security=security,
                    time=keeper,
                )
            )
            started.append(local)
        docs = tuple(x.topology for x in started)
        yield Supernode(
            options=options,
            topology=docs[0],
            clients=Clients(docs[0], security.credentials(), supernodes=docs),
            inprocess=started[0],
            inprocesses=tuple(started),
            supernodes=docs,
            security=security,
            time=keeper,
        )


async def _cancelled(task: asyncio.Future[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def _docker(
    options: LaunchOptions,
    mode: Docker,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
) -> AsyncIterator[Supernode]:
    """Compose through the Docker engine (emulator/runtime/enginelaunch.py, which builds on
    this module)."""
    from cmemu.emulator.runtime import enginelaunch

    async with enginelaunch.launch(options, mode, stop, on_death) as sn:
        yield sn
