"""The manager's liveness stream through a connection that hangs (the engine test's reconnected
container, which once stayed isolated for good): a real device server of an in-process cm-mini
reached through a loopback TCP relay that swallows its first connection whole (accepted, read,
never answered: a connection made as a partition ends) and relays the ones after it. The open
through the swallowed connection is dropped for bringing no first beat
(liveness.FIRST_BEAT_WALL_S), the stream opened again on a new connection beats, and nothing is
failed for it. Left alone, gRPC would wait out its own 20 s connect timeout, and an open that
hangs past it (the engine test's) forever. The twin, a relay that swallows nothing, drops no
open, beats on and fails nothing, past the bound too: the bound judges only a first beat."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest

from cmemu.emulator.engines.manager import liveness
from cmemu.emulator.engines.manager.liveness import LivenessWatch
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.manager.detector import Detector, Incident
from cmemu.emulator.testing import running_supernode
from cmemu.services.peers import Peers

SCALE = 50.0
DEVICE = "n00-npu1"


@dataclasses.dataclass
class Relay:
    """host:port -> `target`, the first `swallow` connections accepted and never answered."""

    target: str
    swallow: int
    connections: int = 0
    address: str = ""
    _tasks: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.connections <= self.swallow:  # its bytes vanish, as a dead path's do
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass
            writer.close()
            return
        host, port = self.target.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Relay]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _beats(watch: LivenessWatch, count: int, *, after_wall_s: float = 0.0) -> None:
    """Until `count` beats came and `after_wall_s` passed (a bound only stops a hung test)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.timeout(120.0):
        while True:
            if watch.beats >= count and loop.time() - start >= after_wall_s:
                return
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("swallowed", [1, 0])
async def test_an_open_that_hangs_is_dropped_and_the_stream_opened_again(swallowed: int) -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        real = sn.topology.device(DEVICE)
        time = sn.local.time
        assert time is not None
        async with Relay(real.address, swallow=swallowed).running() as relay:
            device = dataclasses.replace(real, address=relay.address)
            peers = Peers(sn.topology, sn.clients.credentials)
            incidents: list[Incident] = []
            watch = LivenessWatch(
                devices={DEVICE: device},
                peers=peers,
                clock=time.timeline,  # the supernode's: its beats' time is the judge's
                detector=Detector(),
                interval_s=DEFAULT_PROFILE.manager.heartbeat_interval_s,
                misses_to_fail=DEFAULT_PROFILE.manager.misses_to_fail,
                on_incident=incidents.append,
                on_back=lambda _: None,
            )
            watch.detector.watch([DEVICE])
            task = asyncio.create_task(watch.run())
            try:
                # past the bound: a healthy stream's later beats are never judged by it
                await _beats(watch, 5, after_wall_s=liveness.FIRST_BEAT_WALL_S + 1.0)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await peers.close()
            assert watch.hung_opens == swallowed, relay.connections
            assert relay.connections == 1 + swallowed  # reopened on a new connection, once
            assert incidents == []  # a hung open is no verdict on the device
