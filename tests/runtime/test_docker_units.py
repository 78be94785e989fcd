"""The Docker engine's parts that need no engine: `docker events` lines, the container fault
kinds' parameters and their refusal without an engine, the healthcheck interval."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmemu.emulator.client.faults import KINDS, inject
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from cmemu.emulator.runtime import composegen
from cmemu.emulator.runtime.docker import DockerEngine, parse_event
from cmemu.emulator.testing import cmemu_up, run_cmemu, running_supernode


def test_a_die_event_carries_the_service_and_its_exit_code() -> None:
    line = (
        '{"status":"die","id":"abc","Type":"container","Action":"die","Actor":{"ID":"abc",'
        '"Attributes":{"com.docker.compose.service":"n01-npu3","exitCode":"137",'
        '"name":"p_n01-npu3_1"}}}'
    )
    event = parse_event(line)
    assert event is not None
    assert (event.action, event.service, event.exit_code) == ("die", "n01-npu3", 137)
    assert parse_event("not json") is None
    assert parse_event("{}") is None


def test_targets_resolve_to_the_containers_that_host_them() -> None:
    engine = DockerEngine(
        "p", servers={"n00": ("n00-npu0", "n00-npu1"), "n01-npu0": ("n01-npu0",), "ems": ("ems",)}
    )
    assert engine.services_of("n00-npu1") == ["n00"]
    assert engine.services_of("n01-npu0") == ["n01-npu0"]
    assert engine.services_of("n01") == ["n01-npu0"]  # a node: every container of it
    with pytest.raises(NotFoundError):
        engine.services_of("n07-npu3")


def test_container_kinds_check_their_parameters() -> None:
    assert KINDS["container-stop"].params_from({"grace_s": "2"}).grace_s == 2.0
    for kind, raw in [
        ("container-stop", {"grace_s": "-1"}),
        ("container-kill", {"signal": "kill; rm"}),
        ("container-netem", {}),
        ("container-netem", {"loss_pct": "101"}),
        ("container-netem", {"jitter_ms": "5", "loss_pct": "1"}),
    ]:
        with pytest.raises(InvalidArgumentError):
            KINDS[kind].params_from(raw)


async def test_without_an_engine_they_say_which_launcher_they_need() -> None:
    async with running_supernode("cm-mini") as sn:
        with pytest.raises(PreconditionError) as caught:
            await inject(sn.clients, "container-kill", "n00-npu0")
        assert caught.value.reason == "LAUNCHER_UNSUPPORTED"


def test_the_devices_health_interval_keeps_their_checks_within_budget() -> None:
    assert composegen.device_health_interval_s(5) == composegen.HEALTH_INTERVAL_MIN_S
    for containers in (26, 56, 627, 1260):
        interval = composegen.device_health_interval_s(containers)
        cores = containers * composegen.HEALTH_CHECK_CPU_S / interval
        assert cores <= composegen.HEALTH_BUDGET_CORES and interval % 5 == 0


def test_cmemu_version_imports_nothing_heavy() -> None:
    """`cmemu --version` answers from the metadata: no grpc, numpy, aiohttp or prometheus."""
    import subprocess
    import sys

    code = (
        "import sys; from cmemu.emulator.cli.entry import main; main(['--version']); "
        "heavy = ('grpc', 'numpy', 'aiohttp', 'prometheus_client', 'yaml', "
        "'cmemu.v1', 'cmemu.emulator.model', 'cmemu.services'); "
        "print(sorted({h for h in heavy for m in sys.modules if m == h or m.startswith(h + '.')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, heavy = out.stdout.splitlines()
    assert version.startswith("cmemu ") and heavy == "[]"


def test_the_container_options_refuse_what_makes_no_sense() -> None:
    engine = run_cmemu("up", "--engine", "docker")
    assert engine.returncode == 2 and "--engine goes with --mode compose" in engine.stderr
    source = run_cmemu("image", "build", "--source", "floppy")
    assert source.returncode == 2 and "invalid choice" in source.stderr
    tag = run_cmemu("image", "build", "--tag", "Not Valid")
    assert tag.returncode == 2 and "not an image name" in tag.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-compose")
def test_without_an_engine_compose_mode_says_so_and_runs_processes(tmp_path: Path) -> None:
    """`cmemu up --mode compose` where no engine answers: said, and the same compose services
    run as local processes; `--engine docker` insists, and fails saying why."""
    nowhere = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    insist = run_cmemu("up", "--mode", "compose", "--engine", "docker", "--preset", "cm-mini",
                       "--state-file", str(tmp_path / "x.json"), env=nowhere)  # fmt: skip
    assert insist.returncode == 1 and "no Docker engine answers" in insist.stderr
    output: list[str] = []
    state_file = tmp_path / "state.json"
    with cmemu_up(state_file, "--mode", "compose", "--preset", "cm-mini", "--ui", "none",
                  env=nowhere, output=output):  # fmt: skip
        status = run_cmemu("status", "--state-file", str(state_file))
        assert status.returncode == 0, status.stderr
        assert "compose" in status.stdout
        assert "26/26 SERVING" in status.stdout
    assert "no Docker engine answers: running the compose file's services as local" in output[0]
