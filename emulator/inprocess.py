"""The in-process launcher: a whole supernode as one server per device in one event loop.

This is the embedded default of `cmemu up`. It consumes the topology document as every launcher
does; it only adds the emulated-time epoch, at the moment the devices start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from types import TracebackType

import structlog

from emulator import health
from emulator.clock import Clock
from emulator.errors import EmulatorError, UnavailableError
from emulator.hardware import DEFAULT_PROFILE, HardwareProfile
from emulator.topology import ServiceKind, Topology
from services.fabric import FabricState, create_fabric
from services.host import ServiceHost
from services.kinds import DeviceHandle, create_device
from services.peers import Peers

log = structlog.get_logger("cmemu.inprocess")


class InProcessSupernode:
    """Async context manager: on entry every device is bound and verified SERVING over gRPC; on
    exit every device turns NOT_SERVING, in-flight calls drain, and the servers stop."""

    def __init__(
        self,
        topology: Topology,
        *,
        profile: HardwareProfile = DEFAULT_PROFILE,
        drain_s: float = 0.2,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.topology = topology
        self.profile = profile
        self.drain_s = drain_s
        self.ready_timeout_s = ready_timeout_s
        self.handles: dict[str, DeviceHandle] = {}
        self.fabric: FabricState | None = None
        self._hosts: list[ServiceHost] = []
        self._peers: Peers | None = None

    async def __aenter__(self) -> InProcessSupernode:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        epoch = time.time()
        self.topology = dataclasses.replace(self.topology, epoch_wall_s=epoch)
        clock = Clock(time_scale=self.topology.time_scale, epoch_wall_s=epoch)
        self._peers = Peers(self.topology)
        self.handles = {
            d.id: create_device(
                d, topology=self.topology, profile=self.profile, clock=clock, peers=self._peers
            )
            for d in self.topology.devices
        }
        self.fabric, fabric_host = create_fabric(
            address=self.topology.service(ServiceKind.FABRIC).address,
            topology=self.topology,
            profile=self.profile,
            clock=clock,
            peers=self._peers,
        )
        self._hosts = [fabric_host, *(h.host for h in self.handles.values())]
        results = await asyncio.gather(
            fabric_host.start(),
            *(h.start() for h in self.handles.values()),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop()
            raise errors[0]
        await fabric_host.set_serving(True)
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                await self._verify_serving()
        except (TimeoutError, EmulatorError):
            await self.stop()
            raise

    async def _verify_serving(self) -> None:
        """Ask every device over gRPC, as a client would: starting is not the same as serving.

        Each check has its own short-lived channel, so a 13,000-device preset does not hold
        13,000 extra sockets open; checks that time out on a loaded machine are asked again
        until `ready_timeout_s` has passed."""
        pending = [d.address for d in self.topology.devices]
        pending += [x.address for x in self.topology.services]
        statuses: dict[str, str] = {}
        deadline = time.monotonic() + self.ready_timeout_s
        while pending and time.monotonic() < deadline:
            statuses = await health.check_many(pending, timeout_s=5.0)
            pending = [a for a, s in statuses.items() if s != "SERVING"]
        if pending:
            shown = ", ".join(f"{a} {statuses[a]}" for a in pending[:5])
            more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
            raise UnavailableError(f"{len(pending)} servers not SERVING after start: {shown}{more}")

    async def stop(self) -> None:
        hosts, self._hosts, self.handles = self._hosts, [], {}
        if hosts:
            await asyncio.gather(*(h.set_serving(False) for h in hosts))
            await asyncio.sleep(self.drain_s)
        if self.fabric is not None:
            await self.fabric.close()
            self.fabric = None
        if self._peers is not None:  # device-to-device channels first: no GOAWAY storm
            await self._peers.close()
            self._peers = None
        await asyncio.gather(*(h.server.stop(self.drain_s) for h in hosts))
