"""The real grpcurl binary against devices of an in-process cm-mini: what a user types, works."""

from __future__ import annotations

import json

import pytest

from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import grpcurl

KINDS = {"n00-npu0": "cmemu.v1.Npu", "n01-cpu1": "cmemu.v1.Cpu", "n01-mem": "cmemu.v1.MemoryPool"}


@pytest.mark.parametrize("device_id", sorted(KINDS))
async def test_list_services(mini: Supernode, device_id: str) -> None:
    address = mini.topology.device(device_id).address
    code, out, err = await grpcurl(address, "list")
    assert code == 0, err
    assert set(out.split()) == {
        "cmemu.v1.Device",
        "cmemu.v1.UnifiedBus",
        KINDS[device_id],
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }


async def test_describe_messages_and_services(mini: Supernode) -> None:
    address = mini.topology.device("n00-npu0").address
    code, out, err = await grpcurl(address, "describe", "cmemu.v1.UbTransaction")
    assert code == 0, err
    assert "message UbTransaction" in out and "bool size_only" in out
    code, out, err = await grpcurl(address, "describe", "cmemu.v1.Npu")
    assert code == 0, err
    assert "rpc SubmitKernel ( .cmemu.v1.Kernel ) returns ( .cmemu.v1.KernelResult )" in out
    code, out, err = await grpcurl(address, "describe", "grpc.reflection.v1.ServerReflection")
    assert code == 0, err


async def test_call_methods_on_an_npu_a_cpu_and_a_memory_pool(mini: Supernode) -> None:
    topo = mini.topology
    npu, cpu, pool = (topo.device(i) for i in ("n00-npu0", "n01-cpu1", "n01-mem"))

    code, out, err = await grpcurl(npu.address, "cmemu.v1.Device/GetInfo")
    assert code == 0, err
    info = json.loads(out)
    assert (info["id"], info["kind"], info["eid"]) == ("n00-npu0", "DEVICE_KIND_NPU", npu.eid)

    kernel = json.dumps({"name": "k", "flops": 3.54e11, "precision": "PRECISION_BF16"})
    code, out, err = await grpcurl("-d", kernel, npu.address, "cmemu.v1.Npu/SubmitKernel")
    assert code == 0, err
    assert json.loads(out)["duration_ns"] == "1000000"

    code, out, err = await grpcurl(cpu.address, "cmemu.v1.Cpu/GetNuma")
    assert code == 0, err
    assert len(json.loads(out)["peers"]) == 4

    code, out, err = await grpcurl(pool.address, "cmemu.v1.MemoryPool/GetPool")
    assert code == 0, err
    assert json.loads(out)["node"] == "n01"

    # a UB write through grpcurl into the pool, read back through grpcurl from the CPU
    code, out, err = await grpcurl(
        "-d", '{"size": 4096}', pool.address, "cmemu.v1.Device/AllocateRegion"
    )
    assert code == 0, err
    offset = json.loads(out).get("offset", "0")
    write = {"op": "UB_OP_WRITE", "dst": {"eid": pool.eid, "offset": offset}, "data": "aGVsbG8="}
    code, out, err = await grpcurl(
        "-d", json.dumps(write), npu.address, "cmemu.v1.UnifiedBus/Submit"
    )
    assert code == 0, err
    read = {"op": "UB_OP_READ", "dst": {"eid": pool.eid, "offset": offset}, "size": 5}
    code, out, err = await grpcurl(
        "-d", json.dumps(read), cpu.address, "cmemu.v1.UnifiedBus/Submit"
    )
    assert code == 0, err
    assert json.loads(out)["data"] == "aGVsbG8="  # base64 of "hello"


async def test_errors_reach_grpcurl_as_status_codes(mini: Supernode) -> None:
    address = mini.topology.device("n00-npu1").address
    code, _, err = await grpcurl(
        "-d",
        '{"op": "UB_OP_READ", "dst": {"eid": 4242}, "size": 8}',
        address,
        "cmemu.v1.UnifiedBus/Submit",
    )
    assert code != 0
    assert "NotFound" in err and "EID 4242" in err
    code, _, err = await grpcurl("-d", '{"size": 0}', address, "cmemu.v1.Device/AllocateRegion")
    assert code != 0 and "InvalidArgument" in err
    code, out, err = await grpcurl(address, "grpc.health.v1.Health/Check")
    assert code == 0 and json.loads(out)["status"] == "SERVING"


async def test_the_fabric_answers_grpcurl(mini: Supernode) -> None:
    address = mini.topology.services[0].address
    code, out, err = await grpcurl(address, "list")
    assert code == 0, err
    assert "cmemu.v1.Fabric" in out.split()
    route = json.dumps({"src": "n00-npu0.d0", "dst": "n01-npu0.d0"})
    code, out, err = await grpcurl("-d", route, address, "cmemu.v1.Fabric/Route")
    assert code == 0, err
    assert len(json.loads(out)["path"]) == 5
    dispatch = json.dumps(
        {
            "op": "COLLECTIVE_OP_MOE_DISPATCH",
            "ranks": ["n00-npu0", "n00-npu1", "n00-npu2", "n00-npu3"],
            "tokens_per_rank": 128,
        }
    )
    code, out, err = await grpcurl("-d", dispatch, address, "cmemu.v1.Fabric/Collective")
    assert code == 0, err
    assert 115_000 < int(json.loads(out)["duration_ns"]) < 117_000
