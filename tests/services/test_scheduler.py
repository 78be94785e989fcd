"""The scheduler service over real gRPC: allocations with their dies, spares and replacement,
failures reported by a controller, events, tokens, every bad input's status, and grpcurl."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from cmemu.emulator.client.channels import Channels
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.client.errors import decode
from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.scheduler.engine import SchedulerEngine
from cmemu.emulator.model.clock import Clock
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import build
from cmemu.emulator.testing import Clients, EventRecorder, free_port_block, grpcurl
from cmemu.services.auth import ServerSecurity
from cmemu.services.peers import Peers
from cmemu.services.scheduler import create_scheduler
from cmemu.v1 import scheduler_pb2 as pb
from cmemu.v1 import scheduler_pb2_grpc

TOKEN = "s3cret-token"


@dataclass
class Served:
    stub: scheduler_pb2_grpc.SchedulerAsyncStub
    state: SchedulerEngine
    events: EventRecorder
    address: str


async def _serve(security: ServerSecurity | None = None) -> AsyncIterator[Served]:
    topology = build("cm384")  # a description only: no device servers are started
    address = f"127.0.0.1:{free_port_block(1)}"
    events = EventRecorder()
    peers = Peers(topology)
    state, host = create_scheduler(
        address=address,
        topology=topology,
        profile=DEFAULT_PROFILE,
        clock=Timeline(Clock()),
        peers=peers,
        events=events,
    )
    if security is not None:
        host.secure(security)
    await host.start()
    await host.set_serving(True)
    channels = Channels(Credentials(token=TOKEN) if security else Credentials())
    try:
        yield Served(
            scheduler_pb2_grpc.SchedulerStub(channels.get(address)), state, events, address
        )
    finally:
        await channels.close()
        await host.stop(0)
        await state.close()
        await state.close()  # idempotent
        await peers.close()


@pytest.fixture
async def sched() -> AsyncIterator[Served]:
    async for served in _serve():
        yield served


async def _error(call: Any) -> tuple[str, str | None, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = decode(err.value)
    return details.code.name, details.reason, details.message


async def test_allocate_get_list_release(sched: Served) -> None:
    policies = await sched.stub.ListPolicies(pb.ListPoliciesRequest())
    assert {p.name for p in policies.policies} == {"first-fit", "best-fit", "topology-aware"}
    assert policies.default_policy == "topology-aware"
    spares = await sched.stub.GetSpares(pb.GetSparesRequest())
    assert spares.target == 12 and len(spares.npus) == 12  # one per rack of cm384

    decode_job = await sched.stub.Allocate(pb.AllocateRequest(job="decode", npus=160))
    assert len(decode_job.npus) == 160 and decode_job.policy == "topology-aware"
    first = decode_job.npus[0]
    assert first.dies == [f"{first.id}.d0", f"{first.id}.d1"] and first.node == first.id[:3]
    assert not set(n.id for n in decode_job.npus) & set(spares.npus)
    prefill = await sched.stub.Allocate(
        pb.AllocateRequest(job="prefill-0", npus=16, priority=3, policy="best-fit", same_rack=True)
    )
    assert len(prefill.nodes) == 2 and len(prefill.racks) == 1 and prefill.priority == 3

    got = await sched.stub.GetAllocation(pb.GetAllocationRequest(job="prefill-0"))
    assert got == prefill
    listing = await sched.stub.ListAllocations(pb.ListAllocationsRequest())
    assert [a.job for a in listing.allocations] == ["decode", "prefill-0"]
    assert (listing.total_npus, listing.allocated_npus, listing.spare_npus) == (384, 176, 12)
    assert listing.free_npus == 384 - 176 - 12 and listing.failed_npus == 0

    released = await sched.stub.Release(pb.ReleaseRequest(job="decode"))
    assert (released.job, released.npus) == ("decode", 160)
    assert [e["job"] for e in sched.events.named("allocated")] == ["decode", "prefill-0"]
    assert sched.events.named("released") == [{"job": "decode", "npus": 160}]
    assert all(device == "scheduler" for device, _, _ in sched.events.events)


async def test_a_controller_reports_failures_and_replaces_from_spares(sched: Served) -> None:
    job = await sched.stub.Allocate(pb.AllocateRequest(job="train", npus=24, same_rack=True))
    victim = job.npus[5].id
    failed = await sched.stub.MarkFailed(pb.MarkRequest(npu=victim))
    assert list(failed.npus) == [victim] and list(failed.affected_jobs) == ["train"]
    flagged = await sched.stub.GetAllocation(pb.GetAllocationRequest(job="train"))
    assert [n.id for n in flagged.npus if n.failed] == [victim]

    replaced = await sched.stub.Replace(pb.ReplaceRequest(job="train", npu=victim))
    (swap,) = replaced.replaced
    assert swap.old_npu == victim
    assert victim not in {n.id for n in replaced.allocation.npus}
    assert not any(n.failed for n in replaced.allocation.npus)
    assert sched.events.named("replaced")[0]["replaced"] == {victim: swap.new_npu}

    node = replaced.allocation.npus[0].node
    await sched.stub.MarkFailed(pb.MarkRequest(node=node))
    held = [n.id for n in replaced.allocation.npus if n.node == node]
    whole = await sched.stub.Replace(pb.ReplaceRequest(job="train", node=node))
    assert sorted(r.old_npu for r in whole.replaced) == held
    assert node not in whole.allocation.nodes
    listing = await sched.stub.ListAllocations(pb.ListAllocationsRequest())
    assert listing.failed_npus == 8 + (not victim.startswith(node))
    healthy = await sched.stub.MarkHealthy(pb.MarkRequest(node=node))
    assert len(healthy.npus) == 8
    assert [e["npus"] for e in sched.events.named("healthy")] == [list(healthy.npus)]


@pytest.mark.parametrize(
    ("call", "code", "reason"),
    [
        ("GetAllocation", "NOT_FOUND", "JOB_NOT_FOUND"),
        ("Release", "NOT_FOUND", "JOB_NOT_FOUND"),
        ("Replace", "NOT_FOUND", "JOB_NOT_FOUND"),
    ],
)
async def test_an_unknown_job_is_not_found(
    sched: Served, call: str, code: str, reason: str
) -> None:
    requests = {
        "GetAllocation": pb.GetAllocationRequest(job="ghost"),
        "Release": pb.ReleaseRequest(job="ghost"),
        "Replace": pb.ReplaceRequest(job="ghost", npu="n00-npu0"),
    }
    got, why, message = await _error(getattr(sched.stub, call)(requests[call]))
    assert (got, why) == (code, reason) and "ghost" in message


@pytest.mark.parametrize(
    ("request_", "code", "reason"),
    [
        (pb.AllocateRequest(job="j", npus=0), "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
        (pb.AllocateRequest(job="j", npus=385), "OUT_OF_RANGE", "TOO_MANY_NPUS"),
        (pb.AllocateRequest(job="j", npus=2**32 - 1), "OUT_OF_RANGE", "TOO_MANY_NPUS"),
        (pb.AllocateRequest(job="j", npus=8, policy="random"), "NOT_FOUND", "UNKNOWN_POLICY"),
        (pb.AllocateRequest(job="j", npus=12, whole_nodes=True), "INVALID_ARGUMENT", None),
        (pb.AllocateRequest(job="j", npus=40, same_rack=True), "OUT_OF_RANGE", "TOO_MANY_NPUS"),
        (pb.AllocateRequest(job="", npus=1), "INVALID_ARGUMENT", "MALFORMED_JOB"),
        (pb.AllocateRequest(job="a/b", npus=1), "INVALID_ARGUMENT", "MALFORMED_JOB"),
        (pb.AllocateRequest(job="x" * 300, npus=1), "INVALID_ARGUMENT", "MALFORMED_JOB"),
        (pb.AllocateRequest(job="j", npus=373), "RESOURCE_EXHAUSTED", "NO_ROOM"),
    ],
)
async def test_bad_allocations_get_clear_statuses(
    sched: Served, request_: pb.AllocateRequest, code: str, reason: str | None
) -> None:
    got, why, message = await _error(sched.stub.Allocate(request_))
    assert got == code and (reason is None or why == reason), message
    assert len(message) < 1100
    listing = await sched.stub.ListAllocations(pb.ListAllocationsRequest())
    assert not listing.allocations and listing.free_npus == 372  # nothing changed


async def test_refusals_of_state_say_what_is_wrong(sched: Served) -> None:
    await sched.stub.Allocate(pb.AllocateRequest(job="j", npus=8))
    code, reason, _ = await _error(sched.stub.Allocate(pb.AllocateRequest(job="j", npus=8)))
    assert (code, reason) == ("FAILED_PRECONDITION", "JOB_EXISTS")
    code, reason, message = await _error(sched.stub.Allocate(pb.AllocateRequest(job="k", npus=368)))
    assert (code, reason) == ("RESOURCE_EXHAUSTED", "NO_ROOM")
    assert "requested 368 NPUs, 364 NPUs free" in message and "12 spare" in message
    job = await sched.stub.GetAllocation(pb.GetAllocationRequest(job="j"))
    npu = job.npus[0].id
    bad_replaces = [
        (pb.ReplaceRequest(job="j"), "INVALID_ARGUMENT", None),
        (pb.ReplaceRequest(job="j", npu="n47-npu7"), "FAILED_PRECONDITION", "NOT_IN_JOB"),
        (pb.ReplaceRequest(job="j", npu="n99-npu0"), "NOT_FOUND", "NPU_NOT_FOUND"),
        (pb.ReplaceRequest(job="j", npu="gpu0"), "INVALID_ARGUMENT", "MALFORMED_ID"),
        (pb.ReplaceRequest(job="j", node="n99"), "NOT_FOUND", "NODE_NOT_FOUND"),
    ]
    for request, want, want_reason in bad_replaces:
        code, reason, message = await _error(sched.stub.Replace(request))
        assert code == want and (want_reason is None or reason == want_reason), message
    for bad in (pb.MarkRequest(), pb.MarkRequest(npu="n00-cpu0"), pb.MarkRequest(node="x")):
        code, _, _ = await _error(sched.stub.MarkFailed(bad))
        assert code in ("INVALID_ARGUMENT", "NOT_FOUND")

    # no spares left: replace refuses, says so, and changes nothing
    spares = await sched.stub.SetSpares(pb.SetSparesRequest(count=0))
    assert spares.target == 0 and not spares.npus
    code, reason, message = await _error(sched.stub.Replace(pb.ReplaceRequest(job="j", npu=npu)))
    assert (code, reason) == ("RESOURCE_EXHAUSTED", "NO_SPARES")
    assert "too few left" in message and "SetSpares" in message
    assert await sched.stub.GetAllocation(pb.GetAllocationRequest(job="j")) == job
    code, _, message = await _error(sched.stub.SetSpares(pb.SetSparesRequest(count=377)))
    assert code == "RESOURCE_EXHAUSTED" and "376" in message


async def test_changes_need_the_token_reads_do_not() -> None:
    async for served in _serve(ServerSecurity(token=TOKEN)):
        assert (await served.stub.Allocate(pb.AllocateRequest(job="ok", npus=1))).npus
        anonymous = Channels(Credentials())
        try:
            stub = scheduler_pb2_grpc.SchedulerStub(anonymous.get(served.address))
            assert (await stub.ListAllocations(pb.ListAllocationsRequest())).allocations
            for call in (
                stub.Allocate(pb.AllocateRequest(job="no", npus=1)),
                stub.Release(pb.ReleaseRequest(job="ok")),
                stub.SetSpares(pb.SetSparesRequest(count=1)),
                stub.MarkFailed(pb.MarkRequest(npu="n00-npu0")),
            ):
                code, _, _ = await _error(call)
                assert code == "UNAUTHENTICATED"
        finally:
            await anonymous.close()


async def test_grpcurl_reaches_the_scheduler(sched: Served) -> None:
    code, out, err = await grpcurl(sched.address, "list")
    assert code == 0, err
    assert "cmemu.v1.Scheduler" in out.split()
    code, out, err = await grpcurl(sched.address, "cmemu.v1.Scheduler/ListPolicies")
    assert code == 0, err
    assert json.loads(out)["default_policy"] == "topology-aware"
    body = json.dumps({"job": "probe", "npus": 16, "whole_nodes": True})
    code, out, err = await grpcurl("-d", body, sched.address, "cmemu.v1.Scheduler/Allocate")
    assert code == 0, err
    nodes = json.loads(out)["nodes"]
    assert len(nodes) == 2
    elsewhere = json.dumps({"job": "probe", "node": "n47" if "n47" not in nodes else "n00"})
    code, _, err = await grpcurl("-d", elsewhere, sched.address, "cmemu.v1.Scheduler/Replace")
    assert code != 0 and "FailedPrecondition" in err and "NOT_IN_JOB" in err
    code, out, err = await grpcurl(sched.address, "grpc.health.v1.Health/Check")
    assert code == 0 and json.loads(out)["status"] == "SERVING"


async def test_every_supernode_serves_a_scheduler(clients: Clients) -> None:
    """As a serving deployment uses it: through the launcher's scheduler and the typed client."""
    stub = clients.scheduler()
    decode = await stub.Allocate(pb.AllocateRequest(job="decode", npus=8, whole_nodes=True))
    prefill = await stub.Allocate(pb.AllocateRequest(job="prefill", npus=4))
    assert len(decode.nodes) == 1 and len(prefill.npus) == 4
    assert all(clients.topology.device(n.id).node == n.node for n in decode.npus)
    assert (await stub.Release(pb.ReleaseRequest(job="decode"))).npus == 8
    assert (await stub.Release(pb.ReleaseRequest(job="prefill"))).npus == 4
