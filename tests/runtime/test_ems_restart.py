"""Issue 21 finding 3: after SIGKILL and restart of EMS in procs mode, with one node's pool
process dead too, an acknowledged key is never NOT_FOUND. While the restarted EMS rebuilds its
index (it waits for the dead pool), calls about keys answer UNAVAILABLE, reason RECOVERING,
retryable, and its health is NOT_SERVING; `Stat` says it is recovering, how many pools it has
listed, and the dead pool is not healthy. Once it ends every key reads back whole and its
health turns SERVING."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from cmemu.emulator.client import health
from cmemu.emulator.client.errors import decode
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.topology import DeviceKind
from cmemu.emulator.runtime import state
from cmemu.v1 import ems_pb2, ems_pb2_grpc
from tests.runtime.test_procs import serve_processes, up

KEYS = 8
# the restarted EMS waits this long (wall) for the dead pool, counted from when it listens
# (the rebuild runs after its server started, NOT_SERVING): the window this test must see,
# each of its rounds (a health check, a Stat, 8 Gets) a small fraction of it
REBUILD_WAIT_S = 10
WAIT_S = 120.0  # bounds a hung test


async def _through_recovery(
    address: str, objects: dict[str, bytes], restarted: asyncio.subprocess.Process
) -> tuple[set[str], list[ems_pb2.StatResponse]]:
    """Stat, then Get of every key, over and over from the restarted EMS's first answer until
    it has recovered: the answers seen ("OK", "CODE REASON") and every Stat."""
    answers: set[str] = set()
    stats: list[ems_pb2.StatResponse] = []
    async with asyncio.timeout(WAIT_S), grpc.aio.insecure_channel(address) as channel:
        ems: ems_pb2_grpc.EmsAsyncStub = ems_pb2_grpc.EmsStub(channel)
        recovered = False
        while not recovered:
            assert restarted.returncode is None, "the restarted EMS exited"
            try:
                # health first: SERVING is set once the rebuild has ended, never before, so a
                # Stat after a SERVING answer cannot say recovering
                said = await health.check(channel, timeout_s=10)
                stats.append(await ems.Stat(ems_pb2.StatRequest(), timeout=10))
            except (EmulatorError, grpc.aio.AioRpcError):  # health typed, Stat raw
                await asyncio.sleep(0.1)  # not listening yet
                continue
            recovered = not stats[-1].recovering
            answers.add(f"health {said}")
            assert recovered or said == "NOT_SERVING", (said, stats[-1])
            for key, data in objects.items():
                try:
                    got = await ems.Get(ems_pb2.GetRequest(key=key), timeout=60)
                except grpc.aio.AioRpcError as exc:
                    error = decode(exc)
                    answers.add(f"{error.code.name} {error.reason}")
                    assert error.code != grpc.StatusCode.NOT_FOUND, (key, error)
                    assert error.reason == "RECOVERING" and error.retryable, error
                    assert not recovered, error
                else:
                    answers.add("OK")
                    assert got.data == data, key
        while (said := await health.check(channel, timeout_s=10)) != "SERVING":
            assert said == "NOT_SERVING", said
            await asyncio.sleep(0.1)  # recovered: SERVING follows the rebuild's end
        answers.add(f"health {said}")
    return answers, stats


@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
def test_a_restarted_ems_never_answers_not_found_for_an_acknowledged_key(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with up(state_file, "--preset", "cm-mini", "--mode", "procs", "--per", "node"):
        topology = state.read(state_file)
        address = next(s.address for s in topology.services if s.id == "ems")
        objects = {f"key-{i}": bytes([i]) * (1000 + i) for i in range(KEYS)}
        commands = {
            " ".join(Path(f"/proc/{p}/cmdline").read_text().split("\0")): p
            for p in serve_processes(tmp_path)
        }
        ems_cmd, ems_pid = next((c, p) for c, p in commands.items() if "--service ems" in c)
        pool_pid = next(p for c, p in commands.items() if "--node n00" in c)

        async def scenario() -> tuple[set[str], list[ems_pb2.StatResponse]]:
            async with grpc.aio.insecure_channel(address) as channel:
                ems = ems_pb2_grpc.EmsStub(channel)
                for key, data in objects.items():  # acknowledged: each Put answered OK
                    await ems.Put(ems_pb2.PutRequest(key=key, data=data), timeout=60)
            os.kill(pool_pid, signal.SIGKILL)  # node n00's process dies, its pool with its copies
            os.kill(ems_pid, signal.SIGKILL)  # and EMS with all its metadata
            restarted = await asyncio.create_subprocess_exec(
                *ems_cmd.split(),
                *("--rebuild-wait", str(REBUILD_WAIT_S)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                return await _through_recovery(address, objects, restarted)
            finally:
                restarted.send_signal(signal.SIGTERM)
                await asyncio.wait_for(restarted.wait(), 30)

        answers, stats = asyncio.run(scenario())
        # the window was seen (UNAVAILABLE RECOVERING), and every key read back once it ended
        assert "UNAVAILABLE RECOVERING" in answers and "OK" in answers, answers
        # and health said NOT_SERVING while it recovered, SERVING once it had
        assert {"health NOT_SERVING", "health SERVING"} <= answers, answers
        during = [s for s in stats if s.recovering]
        assert during, stats
        total = len(topology.of_kind(DeviceKind.MEMPOOL))
        for s in during:
            assert s.pools_total == total and s.pools_listed < total, s
            assert not {p.pool: p.healthy for p in s.pools}["n00-mem"], s
        final = stats[-1]
        assert not final.recovering and final.pools_listed == total - 1, final
        assert final.objects == KEYS, final
        assert not {p.pool: p.healthy for p in final.pools}["n00-mem"], final
