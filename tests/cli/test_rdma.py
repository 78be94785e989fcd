"""`cmemu rdma` as a user runs it, against a real `cmemu up` of cm-minix1 (one supernode with
the RDMA plane): queue pairs, write / read / send, stats, links, route, faults, bad inputs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cmemu.emulator import testing
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.topology import server_count
from cmemu.emulator.runtime import state
from cmemu.emulator.testing import free_port_block, run_cmemu
from cmemu.v1 import device_pb2, ub_pb2

PRESET = "cm-minix1"


async def _allocate(state_file: Path, npu: str) -> int:
    clients = state.clients(state_file)
    try:
        region = await clients.device(npu).AllocateRegion(
            device_pb2.AllocateRegionRequest(size=1 << 20, label="cli-rdma")
        )
        return region.offset
    finally:
        await clients.close()


async def _receive(state_file: Path, npu: str) -> ub_pb2.ReceiveResponse:
    clients = state.clients(state_file)
    try:
        got: ub_pb2.ReceiveResponse = await clients.bus(npu).Receive(
            ub_pb2.ReceiveRequest(max_messages=1)
        )
        return got
    finally:
        await clients.close()


def test_rdma_qp_ops_stats_faults(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build_cluster(PRESET)[0]), start=27400)
    with testing.cmemu_up(
        state_file, "--preset", PRESET, "--base-port", str(base), timeout_s=60, quiet=True
    ):
        where = ("--state-file", str(state_file))

        def ok(*args: str) -> str:
            result = run_cmemu("rdma", *args, *where)
            assert result.returncode == 0, (args, result.stderr)
            return result.stdout

        def fails(code: str, *args: str) -> str:
            result = run_cmemu("rdma", *args, *where)
            assert result.returncode != 0, (args, result.stdout)
            assert code in result.stderr, result.stderr
            return result.stderr

        a = json.loads(ok("qp", "create", "n00-npu0", "--json"))
        b = json.loads(ok("qp", "create", "n01-npu2.d1", "--json"))
        assert (a["local"], b["local"], a["state"]) == ("n00-npu0.d0", "n01-npu2.d1", "INIT")
        out = ok(
            "qp",
            "connect",
            str(a["qpn"]),
            "--remote-gateway",
            "sn0-gw",
            "--remote-qpn",
            str(b["qpn"]),
        )
        assert "RTS to sn0-gw" in out and "n01-npu2.d1" in out
        listing = ok("qp", "ls")
        assert listing.count("RTS") == 2

        offset = asyncio.run(_allocate(state_file, "n01-npu2"))
        wrote = ok("write", str(a["qpn"]), "--offset", str(offset), "--data", "hello rdma")
        assert "write 10 bytes n00-npu0.d0 -> n01-npu2.d1" in wrote and "n00-leaf" in wrote
        read = json.loads(
            ok("read", str(a["qpn"]), "--offset", str(offset), "--size", "10", "--json")
        )
        assert read["data"] == "hello rdma" and read["duration_ns"] > 0
        bulk = json.loads(
            ok("write", str(a["qpn"]), "--offset", str(offset), "--size", "1MiB", "--json")
        )
        assert int(bulk["size"]) == 1 << 20
        ok("send", str(a["qpn"]), "--data", "ping")
        (message,) = asyncio.run(_receive(state_file, "n01-npu2")).messages
        assert (message.data, message.src_device) == (b"ping", "n00-npu0")

        stats = json.loads(ok("stats", "--json"))
        assert (stats["write_ops"], stats["read_ops"], stats["send_ops"]) == ("2", "1", "1")
        assert "writes" not in ok("stats") and "sn0-gw" in ok("stats")
        assert "timed by sn0-gw" in ok("links", "--top", "3")
        route = ok("route", "n00-npu0.d0", "n01-npu2.d1")
        assert route.splitlines()[0] == "n00-npu0.d0 > n00-leaf > spine0 > n01-leaf > n01-npu2.d1"
        assert "3 switches, 8 ECMP paths" in route

        added = json.loads(
            ok("fault", "add", "link-slow", "n00-leaf~spine0", "--factor", "0.5", "--json")
        )
        assert added[0]["kind"] == "link-slow" and added[0]["id"]
        assert added[0]["id"] in ok("fault", "ls")
        ok("fault", "add", "gateway-down")
        assert "DOWN" in ok("stats")
        fails("UNAVAILABLE (GATEWAY_DOWN)", "send", str(a["qpn"]), "--data", "x")
        assert "0 left" in ok("fault", "clear", "--all")
        assert "no faults" in ok("fault", "ls")

        fails("INVALID_ARGUMENT (NOT_AN_NPU)", "qp", "create", "n00-cpu1")
        fails("NOT_FOUND (QP_NOT_FOUND)", "write", "99", "--data", "x")
        fails(
            "NOT_FOUND (GATEWAY_NOT_FOUND)",
            "qp",
            "connect",
            str(a["qpn"]),
            "--remote-gateway",
            "sn3-gw",
            "--remote-qpn",
            "1",
        )
        fails("INVALID_ARGUMENT", "fault", "add", "meltdown", "spine0")
        fails("not a whole number", "write", "zero", "--data", "x")  # argparse refuses it
        ok("qp", "destroy", str(b["qpn"]))
        assert ok("qp", "ls").count("\n") == 2  # the header and one QP
