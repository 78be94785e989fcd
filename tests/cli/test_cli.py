"""`cmemu` as a user runs it: real subprocesses, real ports, real signals."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from cmemu.emulator import testing
from cmemu.emulator.client import health
from cmemu.emulator.client.status import code_name
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.testing import MINI_PORTS, MINI_SERVERS, free_port_block, run_cmemu

cmemu = run_cmemu


@contextmanager
def mini_up(state_file: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    base = free_port_block(MINI_PORTS)
    args = ("--preset", "cm-mini", "--base-port", str(base), *extra)
    with testing.cmemu_up(state_file, *args, timeout_s=60) as proc:
        yield proc, base


def test_up_ls_probe_and_graceful_stop(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with mini_up(state_file) as (proc, base):
        doc = json.loads(state_file.read_text())
        assert doc["preset"] == "cm-mini" and doc["launcher"]["pid"] == proc.pid
        assert doc["devices"][0]["address"] == f"127.0.0.1:{base}"
        assert doc["epoch_wall_s"] > 0

        ls = cmemu("ls", "--state-file", str(state_file))
        assert ls.returncode == 0, ls.stderr
        assert f"{MINI_SERVERS}/{MINI_SERVERS} SERVING" in ls.stdout
        assert "n01-mem" in ls.stdout and "fabric" in ls.stdout

        rows = json.loads(
            cmemu("ls", "--state-file", str(state_file), "--kind", "cpu", "--json").stdout
        )
        assert [r["id"] for r in rows] == [f"n0{n}-cpu{i}" for n in range(2) for i in range(4)]
        assert {r["health"] for r in rows} == {"SERVING"}

        probe = cmemu("probe", f"127.0.0.1:{base}")
        assert (probe.returncode, probe.stdout.strip()) == (0, "SERVING")
        probe = cmemu("probe", f"127.0.0.1:{base}", "--service", "cmemu.v1.Npu")
        assert probe.returncode == 0
        probe = cmemu("probe", f"127.0.0.1:{base}", "--service", "no.such.Service")
        assert probe.returncode == 4

        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "grpcurl -plaintext" in out and "cmemu: stopped" in out
        assert not state_file.exists()
    closed = cmemu("probe", f"127.0.0.1:{base}", "--timeout", "0.5")
    assert closed.returncode == 3 and "UNAVAILABLE" in closed.stderr


def test_health_turns_not_serving_before_the_servers_stop(tmp_path: Path) -> None:
    """After SIGINT a server answers NOT_SERVING for the drain before it stops: a client that
    keeps asking sees NOT_SERVING before it sees the connection refused (whatever the pace of a
    busy host: the order is what is checked, not a deadline)."""
    state_file = tmp_path / "state.json"
    with mini_up(state_file, "--drain", "5") as (proc, base):

        async def watch() -> list[str]:
            seen: list[str] = []
            async with grpc.aio.insecure_channel(f"127.0.0.1:{base + 5}") as channel:
                assert await health.check(channel, timeout_s=30) == "SERVING"
                proc.send_signal(signal.SIGINT)
                while not seen or seen[-1] == "SERVING":
                    try:
                        seen.append(await health.check(channel, timeout_s=30))
                    except EmulatorError as exc:
                        seen.append(code_name(exc))
            return seen

        seen = asyncio.run(watch())
        assert seen[-1] == "NOT_SERVING", seen
        proc.communicate(timeout=60)
        assert proc.returncode == 0


def test_a_port_already_taken_is_named(tmp_path: Path) -> None:
    base = free_port_block(MINI_PORTS)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base + 7))
        squatter.listen()
        result = cmemu(
            "up",
            "--preset",
            "cm-mini",
            "--base-port",
            str(base),
            "--state-file",
            str(tmp_path / "s.json"),
        )
    assert result.returncode == 1
    assert f"127.0.0.1:{base + 7}" in result.stderr and "n00-npu7" in result.stderr
    assert "already in use" in result.stderr
    assert not (tmp_path / "s.json").exists()


def test_serve_says_why_its_metrics_cannot_bind(tmp_path: Path) -> None:
    """Issue 21, finding 10: an unresolvable host is reported as such, not as a port in use;
    a port that is in use still is."""
    base = free_port_block(MINI_PORTS)
    env = {"CMEMU_EPOCH": "1"}
    for host in ("127.0.0.1", "no-such-host.invalid"):  # RFC 6761: never resolves
        doc = cmemu(
            "topology", "--preset", "cm-mini", "--host", host, "--base-port", str(base), "--json"
        )
        (tmp_path / f"{host}.json").write_text(doc.stdout)
    serve = ("serve", "--service", "fabric", "--insecure", "--topology")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", json.loads(doc.stdout)["metrics_port"]))
        squatter.listen()
        taken = cmemu(*serve, str(tmp_path / "127.0.0.1.json"), env=env)
    assert taken.returncode == 1 and "ADDRESS_IN_USE" in taken.stderr, taken.stderr
    assert "/metrics" in taken.stderr and "address already in use" in taken.stderr
    unknown = cmemu(*serve, str(tmp_path / "no-such-host.invalid.json"), env=env)
    assert unknown.returncode == 1, unknown.stderr
    assert "ADDRESS_UNRESOLVABLE" in unknown.stderr, unknown.stderr
    assert "cannot resolve no-such-host.invalid" in unknown.stderr
    assert "in use" not in unknown.stderr.lower() and "Traceback" not in unknown.stderr


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["up", "--preset", "cm999"], 2, "unknown preset 'cm999'; known: cm-mini, cm192"),
        (["topology", "--preset", "nope"], 2, "known: cm-mini"),
        (["up", "--preset", "cm-mini", "--time-scale", "0"], 2, "must be a finite number > 0"),
        (
            ["status", "--timeout", "2x"],
            2,
            "not a duration: '2x' (a duration such as 30s, 10m, 1m30s",
        ),
        (["up", "--preset", "cm-mini", "--ready-timeout", "0ms"], 2, "must be a duration > 0"),
        (["up", "--preset", "cm-mini", "--drain=-1s"], 2, "not a duration: '-1s'"),
        (["down", "--timeout", "forever"], 2, "not a duration: 'forever'"),
        (["rdma", "fault", "add", "gateway-down", "sn1-gw", "--for", "1y"], 2, "not a duration"),
        (["up", "--base-port", "65000"], 2, "past 65535: give a --base-port of at most"),
        (["ls", "--state-file", "/nonexistent/cmemu.json"], 1, "no running emulator"),
        (["probe"], 2, "address"),
        (["frobnicate"], 2, "invalid choice"),
    ],
)
def test_bad_input_exits_non_zero_with_a_message(args: list[str], code: int, words: str) -> None:
    result = cmemu(*args)
    assert result.returncode == code
    assert words in result.stderr


def test_ls_with_a_corrupt_state_file(tmp_path: Path) -> None:
    bad = tmp_path / "state.json"
    bad.write_text("{not json")
    result = cmemu("ls", "--state-file", str(bad))
    assert result.returncode == 1 and "not JSON" in result.stderr


def test_topology_json_lists_every_device(tmp_path: Path) -> None:
    result = cmemu("topology", "--preset", "cm384", "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert len(doc["devices"]) == 384 + 192 + 48
    assert set(doc["devices"][0]) == {"id", "kind", "node", "eid", "address"}
    summary = cmemu("topology", "--preset", "cm-mini")
    assert "16 npu" in summary.stdout and "14 l1" in summary.stdout


def test_presets_and_hardware_listings() -> None:
    presets = cmemu("presets")
    assert "cm384" in presets.stdout and "extrapolated" in presets.stdout
    hardware = cmemu("hardware")
    assert "npu.hbm_bytes_per_die" in hardware.stdout and "pub" in hardware.stdout


def test_loopback_addressing_gives_each_device_its_own_ip() -> None:
    doc = json.loads(
        cmemu("topology", "--preset", "cm-mini", "--addressing", "loopback", "--json").stdout
    )
    addresses = [d["address"] for d in doc["devices"]]
    assert addresses[0] == "127.10.1.1:50051"
    assert len(set(addresses)) == len(addresses)
    assert {a.rsplit(":", 1)[1] for a in addresses} == {"50051"}


def test_xfer_and_links_against_a_running_emulator(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with mini_up(state_file) as (proc, _):
        small = cmemu(
            "xfer",
            "n00-npu0",
            "n00-npu1",
            "--bytes",
            "512",
            "--op",
            "read",
            "--state-file",
            str(state_file),
            "--json",
        )
        assert small.returncode == 0, small.stderr
        result = json.loads(small.stdout)
        assert result["emulated_us"] == pytest.approx(1.2, rel=0.001)  # the calibration point
        assert result["path"] == ["n00-npu1.d0", "n00-l1s0", "n00-npu0.d0"]  # a READ's data
        big = cmemu(
            "xfer", "n00-npu0", "n01-mem", "--bytes", str(10**9), "--state-file", str(state_file)
        )
        assert big.returncode == 0, big.stderr
        assert "GB/s" in big.stdout and "l2-p0-" in big.stdout
        links = cmemu("links", "--top", "3", "--state-file", str(state_file), "--json")
        assert links.returncode == 0, links.stderr
        rows = json.loads(links.stdout)
        assert len(rows) == 3 and rows[0]["bytes"] >= 10**9 // 7 * 0.99
        for args, words in [
            (["xfer", "n00-npu0", "n99-npu0", "--bytes", "8"], "no device 'n99-npu0'"),
            (["xfer", "n00-npu0", "n00-npu1", "--bytes", str(1 << 40)], "RESOURCE_EXHAUSTED"),
            (
                ["xfer", "n00-cpu0", "n00-npu1", "--bytes", "8", "--src-die", "1"],
                "INVALID_ARGUMENT",
            ),
        ]:
            bad = cmemu(*args, "--state-file", str(state_file))
            assert bad.returncode == 1 and words in bad.stderr, (args, bad.stderr)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    gone = cmemu("links", "--state-file", str(state_file))
    assert gone.returncode == 1 and "no running emulator" in gone.stderr
