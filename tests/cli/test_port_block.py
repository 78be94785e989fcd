"""Issue 21 findings 12 and 15: every port an instance opens lies in its block and is named in
the state file; `cmemu up` checks the whole block before binding anything, and a clash is one
quick message naming the port and the process that holds it; procs mode's loopback addresses
move with --loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cmemu.emulator.runtime import state
from cmemu.emulator.runtime.ports import EXTRAS, holder
from cmemu.emulator.testing import MINI_PORTS, cmemu_up, free_port_block, run_cmemu

CLASH_WAIT_S = 120.0  # bounds a hung `cmemu up`; the check itself binds each port once


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _opened(path: Path) -> list[str]:
    """Every address the instance of state file `path` names: servers, HTTP, /metrics, broker,
    web view."""
    instance = state.read_instance(path)
    out = []
    for t in instance.supernodes:
        out += [d.address for d in t.devices] + [x.address for x in t.services]
        out += [x.http_address for x in t.services if x.http_address]
    out += [urlsplit(u).netloc for u in instance.launcher.metrics.values()]
    assert instance.topology.broker and instance.launcher.ui
    out += [urlsplit(instance.topology.broker).netloc, urlsplit(instance.launcher.ui).netloc]
    return out


def test_two_instances_side_by_side_each_inside_its_block(tmp_path: Path) -> None:
    first, second = tmp_path / "one.json", tmp_path / "two.json"
    a = free_port_block(MINI_PORTS)
    with cmemu_up(first, "--preset", "cm-mini", "--base-port", str(a), quiet=True):
        b = free_port_block(MINI_PORTS)  # after the first's ports, every one of them bound
        with cmemu_up(second, "--preset", "cm-mini", "--base-port", str(b), quiet=True):
            for path, base in ((first, a), (second, b)):
                size = MINI_PORTS + len(EXTRAS)
                record = state.read_instance(path).launcher.extra["ports"]
                assert record == {"first": base, "last": base + size - 1, "size": size}
                opened = _opened(path)
                assert len(opened) == size == len(set(opened)), opened
                assert all(base <= _port(x) < base + size for x in opened), opened
                ls = run_cmemu("ls", "--state-file", str(path))
                assert ls.returncode == 0, ls.stderr


def test_a_taken_port_in_the_block_is_refused_at_once_naming_its_holder(tmp_path: Path) -> None:
    base = free_port_block(MINI_PORTS)
    taken = base + MINI_PORTS  # the embedded broker's, past every server's
    holder_code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
        "print('listening', flush=True); time.sleep(600)\n"
    )
    squatter = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(taken)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "listening"
        said = holder(taken)
        command = " ".join([sys.executable, "-c", *holder_code.split(), str(taken)])
        assert said == f"pid {squatter.pid} ({command})", said
        path = tmp_path / "clash.json"
        up = run_cmemu(
            *("up", "--preset", "cm-mini", "--base-port", str(base), "--state-file", str(path)),
            timeout=CLASH_WAIT_S,
        )
        assert up.returncode == 1, up.stdout + up.stderr
        said = up.stderr.strip()
        assert f"127.0.0.1:{taken}" in said and "the embedded broker" in said, said
        assert f"pid {squatter.pid}" in said and "nothing was started" in said, said
        assert len(said.splitlines()) == 1 and "Failed to add port" not in up.stderr, said
        assert not path.exists()
    finally:
        squatter.kill()
        squatter.wait()
    # the twin: the same block, now free, comes up
    with cmemu_up(path, "--preset", "cm-mini", "--base-port", str(base), quiet=True):
        assert _port(urlsplit(state.read_instance(path).topology.broker or "").netloc) == taken


def test_a_socket_that_does_not_listen_has_no_holder() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: no LISTEN row in /proc/net/tcp
        assert holder(s.getsockname()[1]) is None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--base-port", "65510"), "past 65535: give a --base-port of at most"),
        (("--mode", "procs", "--loopback", "10.1"), "not a 127.N block inside 127.0.0.0/8"),
        (("--mode", "procs", "--loopback", "127.0"), "not a 127.N block"),
        (("--mode", "procs", "--loopback", "127.300"), "127.N is wanted"),
        (("--mode", "procs", "--loopback", "banana"), "127.N is wanted"),
        (("--loopback", "127.11"), "--loopback goes with --mode procs"),
    ],
)
def test_a_bad_block_is_a_usage_error(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    up = run_cmemu("up", "--preset", "cm-mini", *args, "--state-file", str(tmp_path / "s.json"))
    assert up.returncode == 2 and said in up.stderr, up.stderr


@pytest.mark.xdist_group("loopback-procs")  # the default 127.10 block beside a moved one
def test_procs_instances_side_by_side_on_two_loopback_blocks(tmp_path: Path) -> None:
    port = free_port_block(1)
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    procs = ("--preset", "cm-mini", "--mode", "procs", "--port", str(port), "--metrics", "none")
    with (
        cmemu_up(one, *procs, quiet=True),
        cmemu_up(two, *procs, "--loopback", "127.11", quiet=True),
    ):
        for path, octet in ((one, 10), (two, 11)):
            instance = state.read_instance(path)
            assert instance.launcher.extra["ports"]["loopback"] == f"127.{octet}"
            opened = _opened(path)
            assert all(a.startswith(f"127.{octet}.") for a in opened), opened
            assert urlsplit(instance.topology.broker or "").netloc == f"127.{octet}.0.1:{port}"
            ls = run_cmemu("ls", "--state-file", str(path))
            assert ls.returncode == 0 and "SERVING" in ls.stdout, ls.stderr
        # the default block taken by the first: a third on it is refused, naming the holder
        clash = run_cmemu(
            *("up", *procs, "--state-file", str(tmp_path / "three.json")), timeout=CLASH_WAIT_S
        )
        assert clash.returncode == 1 and "127.10." in clash.stderr, clash.stderr
        assert "held by pid" in clash.stderr and "cmemu" in clash.stderr, clash.stderr
