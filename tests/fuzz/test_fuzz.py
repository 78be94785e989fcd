"""Fuzzing every device service and the fabric through real servers (cm-mini, in a thread of
this process): random and boundary messages and corrupt bodies. Properties, after every call:
never UNKNOWN, never INTERNAL, never a hang; a well-formed call still answers correctly; at the
end every server is SERVING and no acknowledged byte changed."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cmemu.v1 as cmemu_v1
from cmemu.emulator.engines.device.kinds import KINDS as DEVICE_KINDS
from cmemu.emulator.model.emulatorprofile import EmulatorLimits
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.v1 import (
    cpu_pb2,
    device_pb2,
    ems_pb2,
    fabric_pb2,
    mempool_pb2,
    npu_pb2,
    ub_pb2,
)
from tests.fuzz.harness import (
    FuzzTarget,
    Hints,
    Verdict,
    corrupt_bodies,
    fuzz_target,
    messages,
    methods,
    request_class,
)

# Every operation is bounded to 50 emulated ms, so that no accepted call paces for long.
PROFILE = dataclasses.replace(DEFAULT_PROFILE, limits=EmulatorLimits(operation_max_s=0.05))
CANARY = b"ACKNOWLEDGED-" * 8
DEVICES = ("n00-npu0", "n01-cpu1", "n00-mem")
SERVICES = {
    "cmemu.v1.Device": (device_pb2.DESCRIPTOR.services_by_name["Device"], DEVICES),
    "cmemu.v1.UnifiedBus": (ub_pb2.DESCRIPTOR.services_by_name["UnifiedBus"], DEVICES),
    "cmemu.v1.Npu": (npu_pb2.DESCRIPTOR.services_by_name["Npu"], ("n00-npu0",)),
    "cmemu.v1.Cpu": (cpu_pb2.DESCRIPTOR.services_by_name["Cpu"], ("n01-cpu1",)),
    "cmemu.v1.MemoryPool": (mempool_pb2.DESCRIPTOR.services_by_name["MemoryPool"], ("n00-mem",)),
    "cmemu.v1.Fabric": (fabric_pb2.DESCRIPTOR.services_by_name["Fabric"], ("fabric",)),
}


@dataclasses.dataclass
class World:
    target: FuzzTarget
    hints: Hints
    canaries: dict[str, tuple[int, int]]  # device -> (eid, offset) of acknowledged bytes
    keep: dict[str, set[int]]  # device -> region ids the fuzzer must not free


def _setup(target: FuzzTarget) -> World:
    topology = target.topology
    canaries: dict[str, tuple[int, int]] = {}
    keep: dict[str, set[int]] = {}
    ints: list[int] = []
    for device in DEVICES:
        eid = topology.device(device).eid
        regions = []
        for size in (1 << 20, 12 << 10, 4096):  # a region to fuzz into, a spacer, the canary
            code, region = target.call(
                device,
                "cmemu.v1.Device",
                "AllocateRegion",
                device_pb2.AllocateRegionRequest(size=size),
                response=device_pb2.Region,
            )
            assert code is grpc.StatusCode.OK
            regions.append(region)
        canary = regions[-1]
        code, _ = target.call(
            "n01-npu7",
            "cmemu.v1.UnifiedBus",
            "Submit",
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_WRITE,
                dst=ub_pb2.UbAddress(eid=eid, offset=canary.offset),
                data=CANARY,
            ),
            response=ub_pb2.UbCompletion,
        )
        assert code is grpc.StatusCode.OK
        canaries[device] = (eid, canary.offset)
        keep[device] = {r.region_id for r in regions}
        ints += [eid, regions[0].offset, regions[0].offset + 8]
    names = [d.id for d in topology.devices] + [
        "n00-npu0.d1",
        "n01-npu3.d0",
        "n00-npu0.d0~n00-l1s3",
    ]
    names += ["link-down", "switch-down", "partition", "link-degraded", "link-latency", "n00-l1s2"]
    return World(target, Hints(names=names, ints=ints), canaries, keep)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with fuzz_target(PROFILE) as target:
        yield _setup(target)


def _restore(world: World, service: str, method: str, request: object, reply: object) -> None:
    """Undo what a successful random call may legitimately have changed, so that the next one
    starts from a known state: faults, regions, queued messages."""
    t = world.target
    if service == "cmemu.v1.Fabric" and method == "InjectFault":
        t.call("fabric", service, "ClearFault", fabric_pb2.ClearFaultRequest(all=True))
    if service == "cmemu.v1.Device" and method == "SetFaultState":
        for device in DEVICES:
            t.call(device, service, method, device_pb2.FaultState(faulted=False))
    if service == "cmemu.v1.Device" and method == "InjectFault":  # the catalogue's kinds
        for device in DEVICES:
            for kind in DEVICE_KINDS:
                t.call(device, service, "ClearFault", device_pb2.ClearDeviceFaultRequest(kind=kind))
    if service == "cmemu.v1.Device" and method == "AllocateRegion":
        assert isinstance(reply, device_pb2.Region)
        for device in DEVICES:
            t.call(
                device,
                service,
                "FreeRegion",
                device_pb2.FreeRegionRequest(region_id=reply.region_id),
            ) if reply.region_id not in world.keep[device] else None
    if service == "cmemu.v1.UnifiedBus" and method in ("Submit", "Deliver"):
        for device in DEVICES:
            t.call(device, service, "Receive", ub_pb2.ReceiveRequest(max_messages=1000))


def _well_formed(world: World, verdict: Verdict) -> None:
    """One correct call per service kind, answered correctly."""
    t = world.target
    code, info = t.call(
        "n00-npu0",
        "cmemu.v1.Device",
        "GetInfo",
        device_pb2.GetInfoRequest(),
        response=device_pb2.DeviceInfo,
    )
    if code is not grpc.StatusCode.OK or info.id != "n00-npu0":
        verdict.failures.append(f"GetInfo after a random call: {code.name}")
    code, kernel = t.call(
        "n00-npu0",
        "cmemu.v1.Npu",
        "SubmitKernel",
        npu_pb2.Kernel(die=1, flops=354e9, precision=npu_pb2.PRECISION_BF16),
        response=npu_pb2.KernelResult,
    )
    if code is not grpc.StatusCode.OK or kernel.duration_ns != 1_000_000:
        verdict.failures.append(f"SubmitKernel after a random call: {code.name}")
    code, route = t.call(
        "fabric",
        "cmemu.v1.Fabric",
        "Route",
        fabric_pb2.RouteRequest(src="n00-npu0", dst="n01-npu0"),
        response=fabric_pb2.RouteInfo,
    )
    if code is not grpc.StatusCode.OK or route.path[0] != "n00-npu0.d0":
        verdict.failures.append(f"Route after a random call: {code.name}")


def _fuzz(
    world: World, service: str, method: str, request: object, servers: tuple[str, ...]
) -> None:
    t = world.target
    verdict = Verdict()
    svc = SERVICES[service][0]
    desc = svc.methods_by_name[method]
    if isinstance(request, ub_pb2.ReceiveRequest) and request.wait_ms <= 60_000:
        request.wait_ms = min(request.wait_ms, 20)  # a legal wait is a wait: keep it short
    if isinstance(request, fabric_pb2.WatchLinkStatsRequest) and request.interval_ms:
        request.interval_ms = max(request.interval_ms, 10)
    for server in servers:
        if (
            isinstance(request, device_pb2.FreeRegionRequest)
            and request.region_id in world.keep[server]
        ):
            continue  # freeing the canary would legitimately drop its bytes
        code, reply = t.call(
            server,
            service,
            method,
            request,  # type: ignore[arg-type]
            response=request_class_out(desc),
            stream=desc.server_streaming,
        )
        verdict.check(f"{server} {method}({str(request)[:200]})", code, reply)
        if code is grpc.StatusCode.OK:
            _restore(world, service, method, request, reply)
    _well_formed(world, verdict)
    assert not verdict.failures, verdict.failures


def request_class_out(desc: object) -> type:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc.output_type)  # type: ignore[attr-defined]


def _strategy(world_hints: Hints, service: str) -> st.SearchStrategy[tuple[str, object]]:
    svc = SERVICES[service][0]
    return st.one_of(
        *(st.tuples(st.just(m.name), messages(request_class(m), world_hints)) for m in methods(svc))
    )


FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    database=None,
)


@pytest.mark.parametrize("service", sorted(SERVICES))
@FUZZ
@given(data=st.data())
def test_random_messages(world: World, service: str, data: st.DataObject) -> None:
    method, request = data.draw(_strategy(world.hints, service))
    _fuzz(world, service, method, request, SERVICES[service][1])


@pytest.mark.parametrize("service", sorted(SERVICES))
@settings(FUZZ, max_examples=40)
@given(body=corrupt_bodies(), pick=st.integers(0, 100))
def test_corrupt_bodies(world: World, service: str, body: bytes, pick: int) -> None:
    svc, servers = SERVICES[service]
    method = methods(svc)[pick % len(methods(svc))]
    code, reply = world.target.call(
        servers[0], service, method.name, body, stream=method.server_streaming
    )
    if code is grpc.StatusCode.OK:  # some bytes do decode (unknown fields are kept)
        return
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (method.name, body, code, reply)


CLIENT_STREAMS = {  # every request-streaming method of cmemu.v1, and the server that has it
    ("cmemu.v1.Ems", "PutStream"): ("ems", ems_pb2.DESCRIPTOR.services_by_name["Ems"]),
    ("cmemu.v1.Fabric", "SyncClock"): ("fabric", fabric_pb2.DESCRIPTOR.services_by_name["Fabric"]),
}


def test_every_client_stream_is_fuzzed() -> None:
    found = set()
    for info in pkgutil.iter_modules(cmemu_v1.__path__):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(f"cmemu.v1.{info.name}")
            for svc in module.DESCRIPTOR.services_by_name.values():
                found |= {(svc.full_name, m.name) for m in svc.methods if m.client_streaming}
    assert found == set(CLIENT_STREAMS)


@pytest.mark.parametrize("method", sorted(CLIENT_STREAMS))
@settings(FUZZ, max_examples=40)
@given(body=corrupt_bodies(), empties=st.integers(0, 2))
def test_corrupt_bodies_in_client_streams(
    world: World, method: tuple[str, str], body: bytes, empties: int
) -> None:
    """A message that does not decode, first or after empty ones, is INVALID_ARGUMENT (issue 21,
    finding 4: PutStream was INTERNAL), never INTERNAL or UNKNOWN; SyncClock may answer a
    segment (OK) before it reads the bad one."""
    server, svc = CLIENT_STREAMS[method]
    desc = svc.methods_by_name[method[1]]
    bodies = [b""] * empties + [body]
    code, reply = world.target.call_client_stream(
        server, method[0], method[1], bodies, stream=desc.server_streaming
    )
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (bodies, code, reply)
    if not desc.server_streaming:  # PutStream reads every message before it answers
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (bodies, code, reply)


def test_everything_serving_and_every_acknowledged_byte_kept(world: World) -> None:
    """Runs after the fuzz tests in file order, and alone it checks the setup."""
    t = world.target
    for device in [*DEVICES, "fabric"]:
        assert t.health(device) == "SERVING", device
    for device, (eid, offset) in world.canaries.items():
        code, read = t.call(
            "n01-npu7",
            "cmemu.v1.UnifiedBus",
            "Submit",
            ub_pb2.UbTransaction(
                op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=eid, offset=offset), size=len(CANARY)
            ),
            response=ub_pb2.UbCompletion,
        )
        assert code is grpc.StatusCode.OK and read.data == CANARY, device
    print(f"fuzz: {t.calls} calls, {dict(t.codes)}")
