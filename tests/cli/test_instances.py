"""Named instances, `cmemu status`, `cmemu fault`, `cmemu down`, `cmemu up -d` and the usage
errors: real subprocesses against a real cm-mini, as a user runs them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmemu.emulator.cli import argtypes, detach, instances
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.topology import build
from cmemu.emulator.runtime import state
from cmemu.emulator.testing import CMEMU, MINI_DEVICES, MINI_PORTS, free_port_block, run_cmemu
from tests.cli.test_cli import mini_up

cmemu = run_cmemu


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(proc.stdout)


def fake_state(path: Path, pid: int) -> None:
    state.write(path, build("cm-mini"), mode="inprocess")
    doc = json.loads(path.read_text())
    doc["launcher"]["pid"] = pid
    path.write_text(json.dumps(doc))


# --- units ---------------------------------------------------------------------------------------


def test_state_path_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(state.ENV_VAR, raising=False)
    monkeypatch.delenv(state.DIR_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state.resolve() == tmp_path / "xdg" / "cmemu" / "default.json"
    monkeypatch.setenv(state.DIR_ENV_VAR, str(tmp_path / "dir"))
    assert state.path_for("lab-2") == tmp_path / "dir" / "lab-2.json"
    monkeypatch.setenv(state.ENV_VAR, str(tmp_path / "legacy.json"))
    assert state.resolve() == tmp_path / "legacy.json"  # the old override still works
    assert state.resolve(name="lab-2") == tmp_path / "dir" / "lab-2.json"  # --name beats it
    assert state.resolve("x.json", "lab-2") == Path("x.json")  # --state-file beats both
    for bad in ("Lab", "lab_2", "-lab", "lab-", "", "a" * 64, "../etc"):
        with pytest.raises(InvalidArgumentError):
            state.path_for(bad)


def test_launcher_record_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "lab.json"
    state.write(
        path,
        build("cm-mini"),
        mode="procs per node",
        launcher={"run_dir": "/tmp/run", "argv": ["--preset", "cm-mini"]},
    )
    instance = state.read_instance(path)
    assert instance.name == "lab" and instance.alive
    assert instance.launcher.pid == os.getpid() and instance.launcher.mode == "procs per node"
    assert instance.launcher.run_dir == "/tmp/run"
    assert instance.launcher.argv == ("--preset", "cm-mini")
    assert instance.launcher.started_wall_s == pytest.approx(time.time(), abs=60)


def test_check_not_running_names_the_live_pid_and_clears_a_stale_file(tmp_path: Path) -> None:
    live = tmp_path / "live.json"
    fake_state(live, os.getpid())
    with pytest.raises(state.AlreadyRunningError) as caught:
        instances.check_not_running(live)
    assert caught.value.pid == os.getpid()
    assert f"pid {os.getpid()}" in str(caught.value) and "cmemu down --name live" in str(
        caught.value
    )
    assert live.exists()

    stale = tmp_path / "stale.json"
    fake_state(stale, dead_pid())
    instances.check_not_running(stale)
    assert not stale.exists()
    instances.check_not_running(tmp_path / "none.json")  # nothing there: nothing to say


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("1e9", 10**9),
        ("64KiB", 65536),
        ("2GB", 2 * 10**9),
        (str(2**64 - 1), 2**64 - 1),
    ],
)
def test_sizes(text: str, value: int) -> None:
    assert argtypes.size(text) == value


def test_version() -> None:
    result = cmemu("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"cmemu {importlib.metadata.version('cloudmatrix-emulator')}"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["xfer", "a", "b", "--bytes", "-1"], "bad size '-1'"),
        (["xfer", "a", "b", "--bytes", "1e3x"], "bad size '1e3x'"),
        (["xfer", "a", "b", "--bytes", str(2**64)], "over 2**64-1"),
        (["xfer", "a", "b", "--bytes", "0"], "must be > 0"),
        (["links", "--top", "0"], "must be >= 1"),
        (["up", "--preset", "cm999"], "unknown preset 'cm999'; known: cm-mini"),
        (["topology", "--preset", "nope"], "known: cm-mini"),
        (["up", "--preset", "cm-mini", "--time-scale", "0"], "> 0"),
        (["up", "--preset", "cm-mini", "--time-scale", "-2"], "> 0"),
        (["ls", "--name", "Bad_Name"], "DNS label"),
        (["status", "--name", "x" * 64], "DNS label"),
        (["ls", "--name", "a", "--state-file", "b.json"], "not allowed with"),
        (["fault", "add", "meteor", "n00-npu0"], "known: broker-outage, checkpoint-corrupt"),
        (["fault", "rm"], "one fault ID"),
        (["watch", "--count", "-1"], "must be >= 0"),
    ],
)
def test_usage_errors_exit_2(args: list[str], words: str, tmp_path: Path) -> None:
    result = cmemu(*args, env={state.DIR_ENV_VAR: str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_no_such_instance(tmp_path: Path) -> None:
    env = {state.DIR_ENV_VAR: str(tmp_path)}
    for command in ("status", "down", "ls"):
        result = cmemu(command, "--name", "nobody", env=env)
        assert result.returncode == 1
        assert "nobody" in result.stderr and "Traceback" not in result.stderr


def test_status_and_down_of_a_stale_instance(tmp_path: Path) -> None:
    env = {state.DIR_ENV_VAR: str(tmp_path)}
    path = tmp_path / "gone.json"
    pid = dead_pid()
    fake_state(path, pid)
    status = cmemu("status", "--name", "gone", env=env)
    assert status.returncode == 1
    assert f"pid {pid}" in status.stderr and "stale" in status.stderr
    as_json = json.loads(cmemu("status", "--name", "gone", "--json", env=env).stdout)
    assert as_json["running"] is False and as_json["stale"] is True
    down = cmemu("down", "--name", "gone", env=env)
    assert down.returncode == 0 and "stale" in down.stdout
    assert not path.exists()


# --- against a running cm-mini -------------------------------------------------------------------


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_file = tmp_path_factory.mktemp("instance") / "state.json"
    with mini_up(state_file):
        yield state_file


def test_status_of_a_running_instance(running: Path) -> None:
    text = cmemu("status", "--state-file", str(running))
    assert text.returncode == 0, text.stderr
    assert f"{MINI_DEVICES}/{MINI_DEVICES} SERVING" in text.stdout
    assert "fabric" in text.stdout and "ems" in text.stdout and "emulated" in text.stdout
    report = json.loads(cmemu("status", "--state-file", str(running), "--json").stdout)
    doc = json.loads(running.read_text())
    assert report["running"] is True and report["pid"] == doc["launcher"]["pid"]
    assert report["devices_serving"] == MINI_DEVICES and report["services_serving"] == 5
    assert set(report["services"]) == {"fabric", "ems", "scheduler", "router", "manager"}
    assert report["emulated_s"] > 0 and report["uptime_s"] >= 0 and report["time_scale"] == 1
    assert report["broker"].startswith("mqtt://")


def test_fabric_and_device_faults(running: Path) -> None:
    at = ("--state-file", str(running))
    links = json.loads(cmemu("links", "--top", "1", "--json", *at).stdout)
    link = links[0]["link"].replace(">", "~")  # a directed stat names a physical link
    added = cmemu("fault", "add", "link-down", link, *at)
    assert added.returncode == 0, added.stderr
    fabric_id = added.stdout.split()[1].rstrip(":")
    device = cmemu("fault", "add", "device-down", "n01-npu3", "--reason", "test", *at)
    assert device.returncode == 0, device.stderr
    assert "dev:n01-npu3" in device.stdout

    listed = json.loads(cmemu("fault", "ls", "--json", *at).stdout)
    # the device's fault and the rank fault it set on the fabric (its collectives fail)
    rank = [f["id"] for f in listed if f["kind"] == "rank-down"]
    assert {(f["id"], f["kind"], f["target"]) for f in listed} == {
        (fabric_id, "link-down", link),
        ("dev:n01-npu3", "device-down", "n01-npu3"),
        (*rank, "rank-down", "n01-npu3"),
    }
    report = json.loads(cmemu("status", "--json", *at).stdout)
    assert report["devices_serving"] == MINI_DEVICES - 1
    assert report["not_serving"] == {"n01-npu3": "NOT_SERVING"}
    assert len(report["faults"]) == 3

    assert cmemu("fault", "rm", "dev:n01-npu3", *at).returncode == 0
    left = json.loads(cmemu("fault", "ls", "--json", *at).stdout)
    assert [f["kind"] for f in left] == ["link-down"]  # the rank fault went with the device's
    again = cmemu("fault", "rm", "dev:n01-npu3", *at)
    assert again.returncode == 1 and "not faulted" in again.stderr
    assert cmemu("probe", *_address(running, "n01-npu3")).returncode == 0

    assert cmemu("fault", "add", "device-down", "n00-npu5", *at).returncode == 0
    missing = cmemu("fault", "add", "link-degraded", link, *at)
    assert missing.returncode == 2 and "--factor" in missing.stderr
    cleared = cmemu("fault", "rm", "--all", *at)
    assert cleared.returncode == 0, cleared.stderr
    assert "cleared 3 faults" in cleared.stdout  # the link, the device and its rank fault
    assert json.loads(cmemu("fault", "ls", "--json", *at).stdout) == []
    unknown = cmemu("fault", "add", "device-down", "n99-npu0", *at)
    assert unknown.returncode == 1 and "n99-npu0" in unknown.stderr


def test_status_tells_a_hung_device_from_a_not_serving_one(running: Path) -> None:
    """Issue 21 finding 16: a device that does not answer within status's deadline (twice) is
    "no answer (status timed out)", counted apart from NOT_SERVING, not a health of its own;
    `cmemu ls` says NO_ANSWER for it too."""
    at = ("--state-file", str(running))
    try:
        assert cmemu("fault", "add", "hang", "n00-npu1", *at).returncode == 0
        assert cmemu("fault", "add", "device-down", "n00-npu2", *at).returncode == 0
        report = json.loads(cmemu("status", "--json", "--timeout", "1s", *at).stdout)
        assert report["not_serving"] == {"n00-npu1": "NO_ANSWER", "n00-npu2": "NOT_SERVING"}
        assert report["devices_by_status"] == {
            "SERVING": MINI_DEVICES - 2,
            "NO_ANSWER": 1,
            "NOT_SERVING": 1,
        }
        text = cmemu("status", "--timeout", "1s", *at)
        assert text.returncode == 0, text.stderr  # the instance runs: its devices' health is data
        row = next(line for line in text.stdout.splitlines() if line.startswith("devices"))
        assert row.split(None, 1)[1] == (
            f"{MINI_DEVICES - 2}/{MINI_DEVICES} SERVING; 1 NOT_SERVING, "
            "1 no answer (status timed out)"
        ), row
        assert "n00-npu1 no answer (status timed out), n00-npu2 NOT_SERVING" in text.stdout
        # `cmemu ls` surveys the same way: the hung device is no answer, not DEADLINE_EXCEEDED
        rows = json.loads(cmemu("ls", "--json", "--timeout", "1s", "--node", "n00", *at).stdout)
        healths = {r["id"]: r["health"] for r in rows if r["id"] in ("n00-npu1", "n00-npu2")}
        assert healths == {"n00-npu1": "NO_ANSWER", "n00-npu2": "NOT_SERVING"}, rows
    finally:
        cleared = cmemu("fault", "rm", "--all", *at)
        assert cleared.returncode == 0, cleared.stderr
    report = json.loads(cmemu("status", "--json", *at).stdout)
    assert report["devices_by_status"] == {"SERVING": MINI_DEVICES} and not report["not_serving"]


def _address(state_file: Path, device: str) -> list[str]:
    doc = json.loads(state_file.read_text())
    return [next(d["address"] for d in doc["devices"] if d["id"] == device)]


def test_links_watch_draws_frames(running: Path) -> None:
    result = cmemu(
        "links",
        "--watch",
        "--count",
        "2",
        "--interval",
        "0.05",
        "--top",
        "3",
        "--state-file",
        str(running),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("flows in flight") == 2
    frames = cmemu(
        "links",
        "--watch",
        "--json",
        "--count",
        "3",
        "--interval",
        "0.05",
        "--state-file",
        str(running),
    )
    lines = [json.loads(line) for line in frames.stdout.splitlines()]
    assert len(lines) == 3 and lines[0]["emulated_ns"] < lines[2]["emulated_ns"]


def test_output_is_quiet_where_it_should_be(running: Path) -> None:
    piped = subprocess.run(
        [
            "bash",
            "-c",
            f'"{CMEMU}" ls --state-file "{running}" | head -1; echo "exit ${{PIPESTATUS[0]}}" >&2',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert piped.stdout.startswith("ID ") and piped.stdout.count("\n") == 1
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr
    assert piped.stderr.strip() in ("exit 0", "exit 141")
    for args in (["ls"], ["ems", "stat"], ["status"], ["fault", "ls"]):
        result = cmemu(*args, "--state-file", str(running))
        assert result.returncode == 0, (args, result.stderr)
        assert result.stderr == "", args  # client commands log only warnings
        assert not any(line.startswith("{") for line in result.stdout.splitlines()), args


# --- up -d, a second up, down ---------------------------------------------------------------------


def test_detached_up_second_up_and_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(state.DIR_ENV_VAR, str(tmp_path))
    env = {state.DIR_ENV_VAR: str(tmp_path)}
    path = state.path_for("lab")
    base = free_port_block(MINI_PORTS)
    argv = [
        "--log-level",
        "warning",
        "up",
        "--name",
        "lab",
        "--preset",
        "cm-mini",
        "--base-port",
        str(base),
    ]
    try:
        code = detach.up_detached(argv, path, timeout_s=60)
        assert code == 0
        pid = state.read_instance(path).launcher.pid
        assert pid != os.getpid() and state.pid_alive(pid)
        assert detach.log_path(path).exists()

        second = cmemu(
            "up", "--name", "lab", "--preset", "cm-mini", "--base-port", str(base), env=env
        )
        assert second.returncode == 1
        assert f"pid {pid}" in second.stderr and "already running" in second.stderr
        assert "grpc" not in second.stderr.lower().replace("grpcurl", "")

        listed = json.loads(cmemu("instances", "--json", env=env).stdout)
        assert [(r["name"], r["state"], r["pid"]) for r in listed] == [("lab", "running", pid)]

        down = cmemu("down", "--name", "lab", env=env)
        assert down.returncode == 0, down.stderr
        assert f"pid {pid}" in down.stdout
        assert not path.exists() and not state.pid_alive(pid)
        again = cmemu("down", "--name", "lab", env=env)
        assert again.returncode == 1 and "no instance 'lab'" in again.stderr
    finally:
        if path.exists():
            pid = state.read_instance(path).launcher.pid
            if state.pid_alive(pid):
                os.kill(pid, 15)
                instances.wait_exit(pid, 30)


def test_detached_up_that_fails_prints_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    code = detach.up_detached(
        ["up", "--preset", "cm-mini", "--base-port", "65530", "--state-file", str(path)],
        path,
        timeout_s=60,
    )
    assert code == 1
    assert not path.exists()
    err = capsys.readouterr().err
    # a block past 65535 is a usage error (exit 2) saying the highest --base-port that fits
    assert "exited with code 2" in err and "give a --base-port of at most" in err


def test_down_of_an_instance_started_in_the_foreground(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with mini_up(state_file) as (proc, _):
        down = cmemu("down", "--state-file", str(state_file))
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout and not state_file.exists()
        assert proc.wait(timeout=30) == 0
