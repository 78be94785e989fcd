"""What every part of the soak shares, so that each load kind, the chaos, the sampler and the
verification can be a module of its own: the supernode and its stubs, the seeded RNG of the setup
and the verification, the calls (with their figures), and the clock of the run."""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Awaitable

from bench.soak.calls import Calls, Figures
from bench.soak.config import CALL_TIMEOUT_S
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.topology import DeviceKind, ServiceKind, Topology
from cmemu.v1 import ems_pb2_grpc, ub_pb2


class Soak:
    """The shared state of one soak. `rng` is the run's own (seeded by --seed): the setup and the
    verification draw from it in a fixed order; each worker and the chaos have their own."""

    def __init__(self, topology: Topology, clients: Clients, args: argparse.Namespace) -> None:
        self.topology = topology
        self.clients = clients
        self.args = args
        self.ems: ems_pb2_grpc.EmsAsyncStub = ems_pb2_grpc.EmsStub(
            clients.channel_to(topology.service(ServiceKind.EMS).address)
        )
        self.fabric = clients.fabric()
        self.rng = random.Random(args.seed)
        self.npus = topology.of_kind(DeviceKind.NPU)
        self.pools = topology.of_kind(DeviceKind.MEMPOOL)
        self.all_devices = list(topology.devices)
        self.dies = [f"{d.id}.d{die}" for d in self.npus for die in (0, 1)]
        self.l2_switches = [s.id for s in topology.switches if s.tier == "l2"]
        self.figures = Figures()
        self.calls = Calls(self.figures)
        self.stop_at = 0.0
        self.stopping = asyncio.Event()
        self.serial = 0

    def issuer(self, rng: random.Random) -> tuple[str, int]:
        """A random device to issue a UB transaction, and its die (0 on all but NPUs)."""
        device = rng.choice(self.all_devices)
        return device.id, rng.randrange(2) if device.kind is DeviceKind.NPU else 0

    def submit(self, src: str, tx: ub_pb2.UbTransaction) -> Awaitable[ub_pb2.UbCompletion]:
        """One UB transaction issued by `src`, with the soak's hang timeout."""
        return self.clients.bus(src).Submit(tx, timeout=CALL_TIMEOUT_S)

    def serial_id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    async def pause(self, seconds: float) -> bool:
        """Sleep, or less if the run ends: True when it has."""
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True
