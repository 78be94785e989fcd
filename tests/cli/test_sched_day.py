"""`cmemu sched day start|status|stop` as a user runs it, against a real `cmemu up` of cm-mini
at a high time scale: a short compressed night (the deployment undeployed, a job trained, the
deployment back warm from EMS), and the refusals as non-zero exits naming the status."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from cmemu.emulator import testing
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.dayplan import day_plan
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.runtime import state
from cmemu.emulator.testing import free_port_block, run_cmemu

cmemu = run_cmemu


async def _until_ended(state_file: Path, name: str) -> None:
    """Wait for the plan to end, asking through the client API: a `cmemu sched day status` per
    poll would be a process start (most of a CPU second) every poll, on the CPU the emulator's
    clock needs; the CLI's status is asserted on once it has ended."""
    clients = Clients(state.read(state_file), state.credentials(state_file))
    try:
        deadline = time.monotonic() + 120  # bounds a hung test; the plan's time is emulated
        while (plan := await day_plan(clients, name)).state not in ("done", "failed"):
            assert time.monotonic() < deadline, plan
            await asyncio.sleep(0.2)
    finally:
        await clients.close()


@pytest.mark.slow
def test_sched_day_start_status_stop(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build("cm-mini")))
    up = ("--preset", "cm-mini", "--base-port", str(base), "--time-scale", "500")
    with testing.cmemu_up(state_file, *up, "--broker", "none", quiet=True):
        flags = ("--state-file", str(state_file))

        def ok(*args: str) -> str:
            result = cmemu(*args, *flags)
            assert result.returncode == 0, (args, result.stderr)
            return result.stdout

        def fails(code: str, *args: str) -> None:
            result = cmemu(*args, *flags)
            assert result.returncode == 1, (args, result.stdout)
            assert code in result.stderr, result.stderr

        # warm (weights already in EMS: 80 emulated s, not 640 cold): the day plan is this
        # test's point, and a cold load's own CLI path is test_serving's
        ok("serve-model", "deepseek-r1", "--decode", "2", "--prefill", "1x2", "--as", "chat",
           "--warm", "--wait")  # fmt: skip
        day = ("sched", "day", "start", "chat", "--job", "nightly", "--job-npus", "2")
        fails("INVALID_ARGUMENT", *day, "--night", "25-7")
        fails("INVALID_ARGUMENT", *day, "--night-decode-npus", "2")  # no shrink of 2
        fails("NOT_FOUND", "sched", "day", "start", "nope", "--job", "nightly", "--job-npus", "2")
        fails("NOT_FOUND", "sched", "day", "status", "nope")
        bad = cmemu(*day, "--hour-s", "0", *flags)
        assert bad.returncode == 2 and "--hour-s" in bad.stderr

        out = ok(*day, "--night", "1-3", "--start-hour", "0.5", "--hours", "3", "--hour-s", "60",
                 "--checkpoint-every", "2")  # fmt: skip
        assert "day plan chat: chat by day, undeployed and job nightly at night (1-3)" in out
        fails("FAILED_PRECONDITION (PLAN_OVERLAPS)", *day, "--plan", "again")
        asyncio.run(_until_ended(state_file, "chat"))
        plan = json.loads(ok("sched", "day", "status", "chat", "--json"))
        assert plan["state"] == "done", plan["error"]
        assert [s["to"] for s in plan["switches"]] == ["training", "serving"]
        assert int(plan["training_steps"]) > 0
        assert [p["kind"] for p in plan["periods"]] == ["day", "night", "day"]
        text = ok("sched", "day", "status", "chat")
        assert "day plan chat: done" in text and "training steps at night" in text
        assert " training " in text and " serving " in text
        assert "stopping" in ok("sched", "day", "stop", "chat")
        rows = json.loads(ok("deployments", "--json"))
        assert [(r["name"], r["state"], r["npus"]) for r in rows] == [("chat", "serving", 4)]
