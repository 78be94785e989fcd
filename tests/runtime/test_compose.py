"""Compose generation: the committed files are what the generator writes, docker-compose accepts
them, and bridges stay under the Linux limit."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cmemu.emulator.model.errors import InvalidArgumentError, PreconditionError
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime import composegen, composerun
from cmemu.emulator.testing import MINI_DEVICES, MINI_SERVERS

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
COMMITTED = {"cm-mini": "cm-mini.yaml", "cm384": "cm384.yaml"}
DOCKER_COMPOSE = shutil.which("docker-compose") or "docker-compose"


def _config(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DOCKER_COMPOSE, "-f", str(path), "config", "-q"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "CMEMU_EPOCH"} | env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("preset", "name"), sorted(COMMITTED.items()))
def test_committed_compose_files_are_what_the_generator_writes(
    tmp_path: Path, preset: str, name: str
) -> None:
    written = composegen.write(preset, "device", tmp_path / name)
    for path in written:
        assert path.read_text() == (COMPOSE_DIR / path.name).read_text(), (
            f"{path.name} drifted: run cmemu compose --preset {preset} -o compose/{name}"
        )


@pytest.mark.parametrize("name", sorted(COMMITTED.values()))
def test_docker_compose_accepts_every_committed_file(name: str) -> None:
    plain = _config(COMPOSE_DIR / name)  # no variable to set: the fabric owns the epoch
    assert plain.returncode == 0, plain.stderr
    assert "CMEMU_EPOCH" not in plain.stderr  # not even a warning
    given = _config(COMPOSE_DIR / name, CMEMU_EPOCH="1764460800")  # still honoured when set
    assert given.returncode == 0, given.stderr


def test_cm384_per_device_is_one_container_per_device() -> None:
    doc = yaml.safe_load((COMPOSE_DIR / "cm384.yaml").read_text())
    services = doc["services"]
    # every service kind but the gateway (one supernode, no scale-out plane), and the broker
    assert len(services) == 384 + 192 + 48 + len(ServiceKind) - 1 + 1
    npu = services["n07-npu3"]
    assert npu["hostname"] == "n07-npu3"
    assert npu["command"][-2:] == ["--device", "n07-npu3"]
    assert npu["healthcheck"]["test"] == ["CMD", "cmemu-probe", "n07-npu3:50051"]
    assert npu["healthcheck"]["interval"] == "275s"  # 630 containers within the budget
    assert npu["depends_on"] == {"fabric": {"condition": "service_healthy"}}
    assert npu["mem_limit"] == "256m"


def test_per_node_containers_alias_their_devices_and_validate(tmp_path: Path) -> None:
    path = tmp_path / "cm-mini-node.yaml"
    composegen.write("cm-mini", "node", path)
    doc = yaml.safe_load(path.read_text())
    node = doc["services"]["n01"]
    aliases = node["networks"]["sn0-net0"]["aliases"]
    assert "n01-mem" in aliases and len(aliases) == 13
    topology = (tmp_path / "cm-mini.topology.json").read_text()
    assert '"n01-npu1:50052"' in topology  # a node's devices share its IP, one port each
    assert _config(path).returncode == 0


def test_no_bridge_holds_more_than_a_thousand_endpoints() -> None:
    text, _ = composegen.generate("cm8192", "node")
    doc = yaml.safe_load(text)
    members: dict[str, int] = {}
    for svc in doc["services"].values():
        nets = svc["networks"]
        for net in nets if isinstance(nets, list) else nets.keys():
            members[net] = members.get(net, 0) + 1
    assert len(members) == 2
    assert max(members.values()) <= composegen.MAX_BRIDGE_ENDPOINTS
    shared = len(ServiceKind) - 1 + 1  # the supernode-wide services but the gateway, the broker
    assert sum(members.values()) == 1024 + 2 * shared  # they join every bridge


def test_interpolation_follows_compose() -> None:
    env = {"A": "1", "EMPTY": ""}
    assert composerun.interpolate("x${A}y", env) == "x1y"
    assert composerun.interpolate("${B:-dflt}", env) == "dflt"
    assert composerun.interpolate("${EMPTY:-dflt}", env) == "dflt"
    assert composerun.interpolate("${B}", env) == ""
    with pytest.raises(InvalidArgumentError, match="needs \\$B: say so"):
        composerun.interpolate("${B:?say so}", env)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("services: {}\n", "no services"),
        ("[1, 2]\n", "no services"),
        ("services:\n  a: {image: busybox}\n", "mounts no topology"),
        (":\n- bad", "cannot read compose file"),
    ],
)
def test_bad_compose_files_are_refused(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match=words):
        composerun.load(path, {"CMEMU_EPOCH": "1"}, tmp_path)


def test_depends_on_orders_the_start_and_cycles_are_refused(tmp_path: Path) -> None:
    services, (topology,) = composerun.load(
        COMPOSE_DIR / "cm-mini.yaml", {"CMEMU_EPOCH": "5"}, tmp_path
    )
    waves = [[s.name for s in wave] for wave in composerun.start_order(services)]
    assert waves[0] == ["mosquitto"] and waves[1] == ["fabric"]
    assert len(waves[2]) == MINI_DEVICES + 1 and "scheduler" in waves[2]  # it needs the fabric
    assert waves[3] == ["ems"]  # after the memory pools it rebuilds its index from
    assert waves[4] == ["router"]  # after the scheduler and EMS it asks
    assert waves[5] == ["manager"]  # last: it watches them all
    assert topology.epoch_wall_s == 5.0  # $CMEMU_EPOCH, when set, is every process's epoch
    _, (unset,) = composerun.load(COMPOSE_DIR / "cm-mini.yaml", {}, tmp_path)
    assert unset.epoch_wall_s is None  # else the fabric's, asked by each process
    assert topology.device("n00-npu0").address.startswith("127.60.")
    a, b = services[0], services[1]
    looped = [
        composerun.ComposeService(name=a.name, spec=a.spec, depends={b.name: "service_started"}),
        composerun.ComposeService(name=b.name, spec=b.spec, depends={a.name: "service_started"}),
    ]
    with pytest.raises(InvalidArgumentError, match="cycle"):
        composerun.start_order(looped)


@pytest.mark.parametrize("broker", ["none", "mqtt://127.0.0.1:1999"])
def test_a_broker_of_the_launchers_replaces_the_files(tmp_path: Path, broker: str) -> None:
    services, (topology,) = composerun.load(
        COMPOSE_DIR / "cm-mini.yaml", {}, tmp_path, broker=broker
    )
    names = {s.name for s in services}
    assert "mosquitto" not in names and len(names) == MINI_SERVERS
    assert all("mosquitto" not in s.depends for s in services)
    envs = {s.spec.env.get("CMEMU_BROKER") for s in services}
    assert envs == ({None} if broker == "none" else {broker})
    assert topology.broker == (None if broker == "none" else broker)


def test_mosquitto_is_found_off_path_or_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CMEMU_MOSQUITTO", raising=False)
    if Path("/usr/sbin/mosquitto").exists():  # Debian's place, off a user's PATH
        assert composerun.mosquitto_binary() == "/usr/sbin/mosquitto"
    monkeypatch.setenv("CMEMU_MOSQUITTO", "/nonexistent/mosquitto")
    with pytest.raises(PreconditionError, match="apt-get install mosquitto"):
        composerun.mosquitto_binary()
