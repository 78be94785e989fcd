"""The cluster manager's peers (emulator/engines/peers.py ControlPlane) against the real servers
of an in-process cm-mini: each answers in domain types, and where a peer has a direct and a gRPC
implementation the two agree, on an answer and on a refusal (the same EmulatorError class and
reason), which is what lets the engine not know where its peers live."""

from __future__ import annotations

import socket

import pytest

from cmemu.emulator.client import faults
from cmemu.emulator.client.control import RemoteTraining
from cmemu.emulator.client.remote import RemoteDevice
from cmemu.emulator.engines.device.npu import Kernel
from cmemu.emulator.engines.peers import LocalDevice, Marked
from cmemu.emulator.model.errors import (
    EmulatorError,
    NotFoundError,
    PreconditionError,
    UnavailableError,
)
from cmemu.emulator.model.topology import DeviceKind, ServiceKind
from cmemu.emulator.testing import Supernode, running_supernode
from cmemu.services.manager import ManagerService
from cmemu.services.peers import Peers
from cmemu.v1 import manager_pb2, scheduler_pb2, training_pb2

SCALE = 50.0
PROBE = Kernel(name="probe", die=1, flops=4e12, bytes_moved=0, precision="BF16")


def _peers(sn: Supernode) -> Peers:
    """A Directory of its own that hosts nothing: every peer is the gRPC one."""
    return Peers(sn.topology, sn.clients.credentials)


async def _passive(sn: Supernode) -> None:
    """The manager records and does not act: the test's calls are the only ones."""
    await sn.clients.manager().SetMode(
        manager_pb2.SetModeRequest(mode=manager_pb2.MANAGER_MODE_PASSIVE)
    )


async def test_a_kernel_runs_the_same_direct_or_over_grpc_and_a_crash_refuses_both_alike() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        await _passive(sn)
        npu = sn.topology.device("n00-npu1")
        local = LocalDevice(sn.local.devices[npu.id])
        peers = _peers(sn)
        try:
            remote = peers.device(npu)
            assert isinstance(remote, RemoteDevice)
            direct = await local.kernel(PROBE, deadline_s=5.0)
            wired = await remote.kernel(PROBE, deadline_s=5.0)
            assert direct.duration_ns == wired.duration_ns > 0
            assert (direct.name, direct.die, direct.bound) == (wired.name, wired.die, wired.bound)
            await faults.inject(sn.clients, "crash", npu.id)
            refused = []
            for peer in (local, remote):
                with pytest.raises(EmulatorError) as err:
                    await peer.kernel(PROBE, deadline_s=5.0)
                refused.append((type(err.value), err.value.reason))
            assert refused == [(UnavailableError, "PEER_UNREACHABLE")] * 2
        finally:
            await peers.close()


async def test_the_scheduler_peer_isolates_and_replaces_and_its_refusal_is_a_typed_error() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        await _passive(sn)
        alloc = await sn.clients.scheduler().Allocate(
            scheduler_pb2.AllocateRequest(job="j", npus=2)
        )
        held = [n.id for n in alloc.npus]
        other = next(
            d.id for d in sn.topology.devices if d.kind is DeviceKind.NPU and d.id not in held
        )
        peers = _peers(sn)
        try:
            scheduler = peers.scheduler()
            assert await scheduler.mark_failed(held[0]) == Marked(
                npus=(held[0],), affected_jobs=("j",)
            )
            (swap,) = await scheduler.replace("j", held[0])
            assert swap.old == held[0] and swap.new not in held
            with pytest.raises(PreconditionError) as err:  # what makes an incident unrecoverable
                await scheduler.replace("j", other)
            assert err.value.reason == "NOT_IN_JOB" and str(err.value).startswith("scheduler: ")
            assert (await scheduler.mark_healthy(held[0])).npus == (held[0],)
        finally:
            await peers.close()


async def test_restores_from_the_hosted_jobs_or_over_grpc_agree_and_a_missing_job_is_none() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        service = sn.local.service_state(ServiceKind.MANAGER)
        assert isinstance(service, ManagerService)
        hosted = service.training
        spec = training_pb2.TrainingSpec(name="t1", npus=1, steps=0)
        await sn.clients.training().Start(training_pb2.StartTrainingRequest(spec=spec))
        peers = _peers(sn)
        try:
            remote = peers.training()
            assert isinstance(remote, RemoteTraining)  # this Directory hosts no jobs
            assert await hosted.last_restored_ns("t1") == await remote.last_restored_ns("t1") == 0
            assert await hosted.last_restored_ns("t2") is None
            assert await remote.last_restored_ns("t2") is None
            with pytest.raises(NotFoundError):  # no deployment of that name: not a restore
                await peers.router().last_restored_ns("nope")
        finally:
            await peers.close()


async def test_a_server_serves_and_an_address_nothing_answers_on_does_not() -> None:
    async with running_supernode("cm-mini", time_scale=SCALE) as sn:
        with socket.socket() as s:  # a port nobody listens on once closed
            s.bind(("127.0.0.1", 0))
            silent = f"127.0.0.1:{s.getsockname()[1]}"
        manager = sn.topology.service(ServiceKind.MANAGER).address
        peers = _peers(sn)
        try:
            assert await peers.serving(manager, deadline_s=5.0)
            assert not await peers.serving(silent, deadline_s=5.0)
        finally:
            await peers.close()
