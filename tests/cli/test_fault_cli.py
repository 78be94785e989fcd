"""`cmemu fault kinds|add|ls|rm` over the whole catalogue, as a user types it: real `cmemu`
subprocesses against a real cm-mini (in-process, and the procs launcher for process faults)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmemu.emulator.client.faults import KINDS
from cmemu.emulator.testing import cmemu_up, run_cmemu
from tests.cli.test_cli import mini_up

cmemu = run_cmemu


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_file = tmp_path_factory.mktemp("faults") / "state.json"
    with mini_up(state_file, "--time-scale", "10", "--broker", "none"):
        yield state_file


def test_kinds_lists_every_kind_with_its_params() -> None:
    text = cmemu("fault", "kinds")
    assert text.returncode == 0, text.stderr
    for name in KINDS:
        assert name in text.stdout
    assert "--param period_s=<float> (default 10.0)" in text.stdout
    assert "--param factor=<float> (required):" in text.stdout  # link-degraded's
    assert "(default (required))" not in text.stdout
    rows = json.loads(cmemu("fault", "kinds", "--json").stdout)
    assert {r["kind"] for r in rows} == set(KINDS)
    slow = next(r for r in rows if r["kind"] == "slow")
    assert [p["name"] for p in slow["params"]] == ["compute", "link"]
    assert [(p["default"], p["required"]) for p in slow["params"]] == [
        ("0.5", False), ("1.0", False)]  # fmt: skip
    degraded = next(r for r in rows if r["kind"] == "link-degraded")
    assert [(p["default"], p["required"]) for p in degraded["params"]] == [(None, True)]


def _poll(check: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _emulated_s(at: tuple[str, ...]) -> float:
    status = cmemu("status", "--json", *at)
    assert status.returncode == 0, status.stderr
    return float(json.loads(status.stdout)["emulated_s"])


def _poll_emulated(check: object, at: tuple[str, ...], within_s: float) -> None:
    """Until `check()` holds, failing once `within_s` EMULATED seconds passed: a busy host
    slows emulated time (and so the faults' durations) as much as it slows this test."""
    deadline = _emulated_s(at) + within_s
    while not check():  # type: ignore[operator]
        assert _emulated_s(at) < deadline, f"condition not met within {within_s} emulated s"
        time.sleep(0.2)


def _ls(at: tuple[str, ...]) -> dict[str, dict[str, object]]:
    listed = cmemu("fault", "ls", "--json", *at)
    assert listed.returncode == 0, listed.stderr
    return {f["id"]: f for f in json.loads(listed.stdout)}


def test_every_device_kind_adds_lists_and_clears(running: Path) -> None:
    at = ("--state-file", str(running))
    added = {
        "dev:n00-npu1:crash": ("crash", "n00-npu1", "--param", "wipe=false"),
        "dev:n00-npu2:hang": ("hang", "n00-npu2"),
        "dev:n00-npu3:slow": ("slow", "n00-npu3", "--param", "compute=0.5"),
        "dev:n00-npu4:die-down": ("die-down", "n00-npu4", "--param", "die=1"),
        "dev:n00-cpu0:hbm-ecc": (
            "hbm-ecc",
            "n00-cpu0",
            "--param",
            "offset=0",
            "--param",
            "size=64",
        ),
        "dev:n01-mem:pool-loss": ("pool-loss", "n01-mem"),
        "dev:n01-cpu1:sdc": ("sdc", "n01-cpu1", "--param", "offset=0", "--param", "size=64"),
        "node:n01:thermal-throttle": ("thermal-throttle", "n01", "--param", "compute=0.5"),
        "dev:n00-npu5:intermittent-hang": (
            "intermittent-hang",
            "n00-npu5",
            "--param",
            "period_s=600",
            "--param",
            "hang_s=300",
        ),
        "dev:n00-npu6:clock-skew": ("clock-skew", "n00-npu6", "--param", "offset_s=-30"),
    }
    for fault_id, args in added.items():
        result = cmemu("fault", "add", *args, *at)
        assert result.returncode == 0, result.stderr
        assert fault_id in result.stdout
    assert set(added) <= set(_ls(at))
    down = cmemu("probe", *_address(running, "n00-npu1"), "--timeout", "1")
    assert down.returncode != 0
    for fault_id in added:
        assert cmemu("fault", "rm", fault_id, *at).returncode == 0
    assert _ls(at) == {}


def test_durations_end_faults_by_themselves(running: Path) -> None:
    at = ("--state-file", str(running))
    started = cmemu("fault", "add", "node-power-off", "n01", "--for", "40", *at)
    assert started.returncode == 0, started.stderr
    assert "node:n01" in started.stdout and "clears itself at" in started.stdout
    link = f"{_first_link(running)}"
    flap = cmemu(
        "fault", "add", "link-flap", link, "--param", "period_s=2", "--param", "duty=0.5",
        "--for", "40", *at,
    )  # fmt: skip
    assert flap.returncode == 0, flap.stderr
    # in before the first cleared (it said so); not looked up again: at time scale 10 forty
    # emulated seconds may pass during two CLI calls on a busy host
    assert "link-flap" in flap.stdout and "clears itself at" in flap.stdout
    _poll_emulated(lambda: _ls(at) == {}, at, within_s=120)  # both end by themselves at 40 s
    assert cmemu("probe", *_address(running, "n01-npu0")).returncode == 0


def test_durations_take_units(running: Path) -> None:
    """Issue 21, finding 13: `--for 1h` is an hour, as README writes it; a plain number is
    seconds. The clearing time lies the duration after the emulated time before the command
    and at most that after the time read once it returned (no wall-clock figure)."""
    at = ("--state-file", str(running))
    cases = {
        "n00-npu5": ("1h", 3600.0),
        "n00-npu6": ("7200000ms", 7200.0),
        "n00-npu7": ("1d", 86400.0),
    }
    for device, (text, seconds) in cases.items():
        before = _emulated_s(at)
        added = cmemu("fault", "add", "slow", device, "--param", "compute=0.5", "--for", text, *at)
        assert added.returncode == 0, added.stderr
        after = _emulated_s(at)
        until = float(added.stdout.split("clears itself at ")[1].split()[0])
        assert before + seconds - 0.001 <= until <= after + seconds + 0.001, (text, added.stdout)
        assert cmemu("fault", "rm", f"dev:{device}:slow", *at).returncode == 0
    for bad, words in (("30x", "not a duration: '30x'"), ("0s", "must be a duration > 0")):
        refused = cmemu("fault", "add", "crash", "n00-npu0", "--for", bad, *at)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert _ls(at) == {}


def test_bad_input_gets_a_message_not_a_traceback(running: Path) -> None:
    at = ("--state-file", str(running))
    cases = [
        (("slow", "n00-npu0", "--param", "compute=2"), 2, "must be in (0, 1]"),
        (("slow", "n00-npu0", "--param", "speed=2"), 2, "unknown parameter 'speed'"),
        (("crash", "n00-npu0", "--param", "wipe"), 2, "KEY=VALUE"),
        (("link-degraded", "n00-npu0~x"), 2, "--factor"),
        (("crash",), 2, "needs TARGET"),
        (("crash", "n99-npu0"), 1, "n99-npu0"),
        (("die-down", "n00-cpu0"), 1, "FAILED_PRECONDITION"),
        (("process-kill", "n00-npu0"), 1, "procs"),
        (("link-loss", "n00-npu0.d0~n00-l1s0", "--param", "rate=1"), 2, "must be in (0, 1)"),
        (("intermittent-hang", "n00-npu0", "--param", "hang_s=90"), 2, "below period_s"),
        (("optical-module", "l2-p0-s0"), 1, "an L1 chip's"),
        (("l1-board", "n00-l1s0"), 1, "an L1 board is a node's"),
        (("l1-board", "n99"), 1, "no node 'n99'"),
        (("thermal-throttle", "n99"), 1, "no node 'n99'"),
        (("clock-skew", "n00-npu0", "--param", "offset_s=4000"), 2, "within +-3600 s"),
        (("clock-skew", "n00-npu0", "--param", "drift_ppm=-2e5"), 2, "within +-100000 ppm"),
        (("clock-skew", "n00-npu0"), 2, "must be set (nothing would skew)"),
        (("clock-skew", "l2-p0-s0", "--param", "offset_s=1"), 1, "l2-p0-s0"),
    ]
    for args, code, words in cases:
        result = cmemu("fault", "add", *args, *at)
        assert result.returncode == code, (args, result.stderr)
        assert words in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    missing = cmemu("fault", "rm", "dev:n00-npu0:hang", *at)
    assert missing.returncode == 1 and "not faulted" in missing.stderr


def test_a_rack_and_the_ssd_tier_add_list_and_clear(running: Path) -> None:
    at = ("--state-file", str(running))
    lost = cmemu("fault", "add", "ssd-loss", "ems", *at)
    assert lost.returncode == 0, lost.stderr
    fault_id = lost.stdout.split()[1].rstrip(":")
    assert fault_id.endswith(":ssd-loss") and _ls(at)[fault_id]["target"] == "ems"
    assert cmemu("fault", "rm", fault_id, *at).returncode == 0
    assert _ls(at) == {}
    # cm-mini is one rack: with all of it down nothing is left to clear it through
    whole = cmemu("fault", "add", "rack-power-off", "rack00", *at)
    assert whole.returncode == 1 and "RACK_IS_THE_SUPERNODE" in whole.stderr, whole.stderr
    for bad, code, words in (
        ("rack01", 1, "no rack 'rack01'"),
        ("rack1", 1, "INVALID_ARGUMENT (MALFORMED_ID)"),
    ):
        refused = cmemu("fault", "add", "rack-power-off", bad, *at)
        assert refused.returncode == code and words in refused.stderr, refused.stderr
    # 20 emulated s: 2 wall s at this module's time scale (nothing here looks at it while down)
    timed = cmemu("fault", "add", "rack-power-off", "rack00", "--for", "20", *at)
    assert timed.returncode == 0, timed.stderr
    assert "rack:rack00" in timed.stdout and "clears itself at" in timed.stdout
    _poll_emulated(
        lambda: cmemu("probe", *_address(running, "n01-npu0"), "--timeout", "1").returncode == 0,
        at,
        within_s=240,
    )
    _poll_emulated(lambda: _ls(at) == {}, at, within_s=240)


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-procs")  # 127.10.x.y, procs mode's: see tests/conftest.py
def test_process_pause_and_kill_in_procs_mode(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    at = ("--state-file", str(state_file))
    # time scale 4: the manager's detection (3 missed heartbeats 5 emulated s apart) and the
    # return to `restored` are emulated time, a few wall s here; its heartbeat deadline is never
    # under 0.5 wall s (profile.manager), so a loaded host's stalls fail no healthy device
    # (no --base-port: procs mode's loopback addresses are its block, `cmemu up` refuses it)
    args = ("--preset", "cm-mini", "--mode", "procs", "--per", "node", "--time-scale", "4")
    with cmemu_up(state_file, *args, timeout_s=120, quiet=True):
        doc = json.loads(state_file.read_text())
        processes = doc["launcher"]["processes"]
        node = next(p for p in processes.values() if "n01-npu0" in p["servers"])
        paused = cmemu("fault", "add", "process-pause", "n01-npu0", *at)
        assert paused.returncode == 0, paused.stderr
        fault_id = paused.stdout.split()[1].rstrip(":")
        assert fault_id in _ls(at)
        assert cmemu("probe", *_address(state_file, "n01-npu0"), "--timeout", "1").returncode
        # the manager finds the stopped process by its silent liveness stream (bounds only)
        _poll(lambda: _incident(at, "n01-npu0") is not None, timeout_s=120.0)
        assert cmemu("fault", "rm", fault_id, *at).returncode == 0
        assert cmemu("probe", *_address(state_file, "n01-npu0")).returncode == 0
        # and sees it back: the stream it reopened into the stopped process beats again
        _poll(lambda: (_incident(at, "n01-npu0") or {}).get("state") == "restored", 120.0)
        killed = cmemu("fault", "add", "process-kill", "n01-npu0", *at)
        assert killed.returncode == 0, killed.stderr
        _poll(lambda: not _alive(node["pid"]))


def _incident(at: tuple[str, ...], device: str) -> dict[str, object] | None:
    """The manager's latest incident for `device`, as `cmemu manager incidents` lists it."""
    listed = cmemu("manager", "incidents", "--json", *at)
    assert listed.returncode == 0, listed.stderr
    mine = [i for i in json.loads(listed.stdout) if i["device"] == device]
    return mine[-1] if mine else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _address(state_file: Path, device: str) -> list[str]:
    doc = json.loads(state_file.read_text())
    return [next(d["address"] for d in doc["devices"] if d["id"] == device)]


def _first_link(state_file: Path) -> str:
    doc = json.loads(state_file.read_text())
    link = doc["links"][0]
    return f"{link['a']}~{link['b']}"


def test_a_service_that_is_down_is_a_message_and_exit_1_not_a_traceback(running: Path) -> None:
    """The typed clients raise one error type for a server that does not answer: the CLI says
    UNAVAILABLE and exits 1 (beside it, the same command while the service is up exits 0)."""
    at = ("--state-file", str(running))
    up = cmemu("ems", "ls", *at)
    assert up.returncode == 0, up.stderr
    killed = cmemu("fault", "add", "service-kill", "ems", *at)
    assert killed.returncode == 0, killed.stderr
    fault_id = killed.stdout.split()[1].rstrip(":")
    try:
        down = cmemu("ems", "ls", *at)
        assert down.returncode == 1, down.stderr
        assert down.stderr.startswith("cmemu ems: UNAVAILABLE"), down.stderr
        assert "Traceback" not in down.stderr
    finally:
        assert cmemu("fault", "rm", fault_id, *at).returncode == 0
    _poll(lambda: cmemu("ems", "ls", *at).returncode == 0)
