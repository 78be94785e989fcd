"""Nobody changes state anonymously: every RPC classified, UNAUTHENTICATED without the token or
with a wrong one, reads open, binding beyond loopback refused, TLS with the real grpcurl."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import cmemu.v1
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.client.errors import decode
from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.runtime import composegen
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.security import mqtt_password
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import CMEMU, free_port_block, grpcurl
from cmemu.services import auth
from cmemu.v1 import (
    device_pb2,
    device_pb2_grpc,
    fabric_pb2,
    fabric_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    ub_pb2,
)

TOKEN = "s3cret-token"


# --- the table -----------------------------------------------------------------------------------


def _wire_methods() -> set[str]:
    methods = set()
    for module in pkgutil.iter_modules(cmemu.v1.__path__):
        if not module.name.endswith("_pb2"):
            continue
        descriptor = importlib.import_module(f"cmemu.v1.{module.name}").DESCRIPTOR
        for service in descriptor.services_by_name.values():
            methods |= {f"/{service.full_name}/{m.name}" for m in service.methods}
    return methods


def test_every_rpc_of_the_wire_contract_is_classified() -> None:
    methods = _wire_methods()
    unclassified = sorted(methods - set(auth.ACCESS))
    assert not unclassified, f"classify these in services/auth.py ACCESS: {unclassified}"
    stale = sorted(set(auth.ACCESS) - methods)
    assert not stale, f"no such RPC any more, remove from ACCESS: {stale}"


def test_unknown_methods_are_closed_and_health_and_reflection_open() -> None:
    assert auth.access("/cmemu.v1.Scheduler/Allocate") is auth.Access.WRITE
    assert auth.access("/grpc.health.v1.Health/Check") is auth.Access.READ
    assert auth.access("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo") is (
        auth.Access.READ
    )
    assert auth.access("/cmemu.v1.Device/SetFaultState") is auth.Access.WRITE
    assert auth.access("/cmemu.v1.Device/GetInfo") is auth.Access.READ


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:1", True),
        ("127.10.3.4:50051", True),
        ("[::1]:1", True),
        ("localhost:1", True),
        ("0.0.0.0:1", False),
        ("[::]:1", False),
        ("n00-npu0:50051", False),
        ("10.0.0.5:1", False),
    ],
)
def test_loopback(address: str, loopback: bool) -> None:
    assert auth.is_loopback(address) is loopback
    guard = auth.ServerSecurity()
    if loopback:
        guard.check_bind("x", address)
    else:
        with pytest.raises(auth.InsecureBindError, match="--token-file"):
            guard.check_bind("x", address)
        auth.ServerSecurity(token="t").check_bind("x", address)
        auth.ServerSecurity(insecure=True).check_bind("x", address)


def test_a_denying_handler_keeps_the_shape_of_every_call() -> None:
    async def unary(request: Any, context: Any) -> Any:
        return request

    for streaming_in in (False, True):
        for streaming_out in (False, True):
            make = {
                (False, False): grpc.unary_unary_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler,
            }[(streaming_in, streaming_out)]
            denied = auth._denying(make(unary), auth.MISSING)
            assert (denied.request_streaming, denied.response_streaming) == (
                streaming_in,
                streaming_out,
            )


async def test_starting_beyond_loopback_without_a_token_is_refused() -> None:
    options = LaunchOptions(
        preset="cm-mini", mode=InProcess(plan=PortPlan(host="0.0.0.0")), broker=NO_BROKER
    )
    with pytest.raises(auth.InsecureBindError, match=r"0\.0\.0\.0"):
        async with Supernode.start(options):
            pass


# --- a supernode with a token --------------------------------------------------------------------


async def _start(**kw: Any) -> AsyncIterator[Supernode]:
    base = free_port_block(server_count(build("cm-mini")))
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=base)),
        broker=NO_BROKER,
        drain_s=0.0,
        **kw,
    )
    async with Supernode.start(options) as sn:
        yield sn


@pytest.fixture(scope="module")
async def guarded() -> AsyncIterator[Supernode]:
    async for sn in _start(token=TOKEN):
        yield sn


def _code(exc: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str | None]:
    return exc.code(), decode(exc).reason


async def test_writes_need_the_token_reads_do_not(guarded: Supernode) -> None:
    address = guarded.address("n00-npu0")
    for credentials, reason in (
        (Credentials(), "TOKEN_MISSING"),
        (Credentials(token="no"), "TOKEN_INVALID"),
    ):
        async with credentials.channel(address) as channel:
            stub = device_pb2_grpc.DeviceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.AllocateRegion(device_pb2.AllocateRegionRequest(size=4096))
            assert _code(caught.value) == (grpc.StatusCode.UNAUTHENTICATED, reason)
            info = await stub.GetInfo(device_pb2.GetInfoRequest())  # reads stay open
            assert info.id == "n00-npu0"
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_day_plans_need_the_token_their_status_does_not(guarded: Supernode) -> None:
    async with Credentials().channel(guarded.address("scheduler")) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        request = scheduler_pb2.DayPlanRequest(name="chat")
        for call in (
            stub.StartDayPlan(scheduler_pb2.StartDayPlanRequest(deployment="chat")),
            stub.StopDayPlan(request),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert _code(caught.value) == (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # read: open, and no such plan
            await stub.GetDayPlan(request)
        assert _code(caught.value) == (grpc.StatusCode.NOT_FOUND, "PLAN_NOT_FOUND")


async def test_the_fabric_guards_faults_and_streams_reads(guarded: Supernode) -> None:
    fabric = guarded.address("fabric")
    async with Credentials().channel(fabric) as channel:
        stub = fabric_pb2_grpc.FabricStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.InjectFault(fabric_pb2.FabricFault(kind="switch-down", target="l2-p0-s3"))
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert not (await stub.ListFaults(fabric_pb2.ListFaultsRequest())).faults
        stream = stub.WatchLinkStats(fabric_pb2.WatchLinkStatsRequest(top=1, interval_ms=10))
        async for stats in stream:  # a streaming read is open
            assert stats is not None
            break
        stream.cancel()


async def test_clients_with_the_token_change_state(guarded: Supernode) -> None:
    clients = guarded.clients
    assert clients.credentials.token == TOKEN
    region = await clients.device("n00-npu1").AllocateRegion(
        device_pb2.AllocateRegionRequest(size=4096)
    )
    dst = ub_pb2.UbAddress(eid=guarded.topology.device("n00-npu1").eid, offset=region.offset)
    done = await clients.bus("n01-npu0").Submit(
        ub_pb2.UbTransaction(op=ub_pb2.UB_OP_WRITE, dst=dst, data=b"hello")
    )
    assert done.size == 5 and done.complete_ns > done.issue_ns
    read = await clients.bus("n01-npu0").Submit(
        ub_pb2.UbTransaction(op=ub_pb2.UB_OP_READ, dst=dst, size=5)
    )
    assert read.data == b"hello"


# --- TLS -----------------------------------------------------------------------------------------


async def _grpcurl(*args: str) -> tuple[int, str, str]:
    return await grpcurl(*args, plaintext=False)  # the tests name -plaintext or -cacert


async def test_tls_auto_with_grpcurl_and_typed_clients(tmp_path: Path) -> None:
    async for sn in _start(token=TOKEN, tls="auto", tls_dir=tmp_path / "tls"):
        assert sn.security.tls is not None
        ca = str(sn.security.tls.ca)
        assert stat.S_IMODE(sn.security.tls.key.stat().st_mode) == 0o600
        address = sn.address("n00-npu0")
        code, out, err = await _grpcurl("-cacert", ca, address, "list")
        assert code == 0, err
        assert "cmemu.v1.Device" in out
        body = '{"size": 4096}'
        code, out, err = await _grpcurl(
            "-cacert", ca, "-d", body, address, "cmemu.v1.Device/AllocateRegion"
        )
        assert code != 0 and "Unauthenticated" in err
        code, out, err = await _grpcurl(
            "-cacert",
            ca,
            "-H",
            f"authorization: Bearer {TOKEN}",
            "-d",
            body,
            address,
            "cmemu.v1.Device/AllocateRegion",
        )
        assert code == 0, err
        code, _, err = await _grpcurl("-plaintext", address, "list")  # TLS only
        assert code != 0
        # `cmemu probe` takes the CA as grpcurl does; without it the server is unreachable
        probe = await asyncio.create_subprocess_exec(
            CMEMU, "probe", address, "--cacert", ca, stdout=asyncio.subprocess.PIPE
        )
        assert (await probe.communicate())[0].decode().strip() == "SERVING"
        blind = await asyncio.create_subprocess_exec(
            CMEMU, "probe", address, stderr=asyncio.subprocess.DEVNULL
        )
        assert await blind.wait() == 3
        # typed clients verify with the CA; a plaintext one cannot talk to it
        info = await sn.clients.device("n01-mem").GetInfo(device_pb2.GetInfoRequest())
        assert info.id == "n01-mem"
        plain = Clients(sn.topology)
        try:
            with pytest.raises(grpc.aio.AioRpcError):
                await plain.device("n01-mem").GetInfo(device_pb2.GetInfoRequest(), timeout=2)
        finally:
            await plain.close()


# --- compose's broker password -------------------------------------------------------------------


def test_compose_secrets_are_made_once_and_hash_like_mosquitto_passwd(tmp_path: Path) -> None:
    written = composegen.write_secrets(tmp_path)
    assert [p.name for p in written] == ["cmemu.token", "mosquitto.passwd"]
    token = (tmp_path / "cmemu.token").read_text().strip()
    assert len(token) >= 40
    assert stat.S_IMODE((tmp_path / "cmemu.token").stat().st_mode) == 0o600
    assert composegen.write_secrets(tmp_path) == []  # kept: a running deployment uses it
    assert (tmp_path / "cmemu.token").read_text().strip() == token
    line = composegen.mosquitto_passwd_line(
        "cmemu", "secret", salt=b"hl5\x1e\x1b\x03\x08k\xab+;\xff"
    )
    # what `mosquitto_passwd -b FILE cmemu secret` writes with that salt
    assert line == (
        "cmemu:$7$101$aGw1HhsDCGurKzv/$DlTb8NhlHx3OmAXKye/FdRpuBixuX2GPXDWEXSYakxgtBxKwFgm65TMt3V"
        "BTfO0mElbXTX/Falr/uB2ti6NwlA==\n"
    )
    assert composegen.passwd_holds(line, "cmemu", "secret")
    assert not composegen.passwd_holds(line, "cmemu", "Secret")
    assert not composegen.passwd_holds(line, "other", "secret")
    assert not composegen.passwd_holds("cmemu:$7$101$!!$!!\n", "cmemu", "secret")


def test_compose_broker_password_is_derived_and_an_old_file_rewritten(tmp_path: Path) -> None:
    """The password file holds the broker password derived from the token, never the token;
    one written when the token was the password (an older `cmemu compose`) is written anew."""
    composegen.write_secrets(tmp_path)
    token = (tmp_path / "cmemu.token").read_text().strip()
    passwd = tmp_path / "mosquitto.passwd"
    assert composegen.passwd_holds(passwd.read_text(), "cmemu", mqtt_password(token))
    assert not composegen.passwd_holds(passwd.read_text(), "cmemu", token)
    passwd.write_text(composegen.mosquitto_passwd_line("cmemu", token))  # the old way
    assert composegen.write_secrets(tmp_path) == [passwd]
    assert composegen.passwd_holds(passwd.read_text(), "cmemu", mqtt_password(token))
    assert (tmp_path / "cmemu.token").read_text().strip() == token  # the token stays
    assert stat.S_IMODE(passwd.stat().st_mode) == 0o644
