"""Running a compose file as local processes (`cmemu up --from-compose`), without an engine.

It reads any compose file of the shape composegen writes: it gives every service a loopback
address in place of its hostname, rewrites the mounted topology document to match, and runs
exactly each service's command with its environment, in depends_on order, waiting for
healthchecks where asked.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from emulator.model.errors import InvalidArgumentError
from emulator.model.topology import Topology, loopback_ip
from emulator.runtime.composegen import MQTT_PORT
from emulator.runtime.procs import ProcSpec

COMPOSE_FIRST_OCTET = 60  # 127.60.x.y: apart from process mode's 127.10.x.y

VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-?])([^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}."""

    def one(m: re.Match[str]) -> str:
        name, kind, arg = m.group(1), m.group(2), m.group(3) or ""
        if env.get(name):
            return env[name]
        if kind == "?":
            raise InvalidArgumentError(f"compose needs ${name}: {arg}")
        return arg if kind == "-" else ""

    return VAR.sub(one, value)


@dataclass(frozen=True, kw_only=True)
class ComposeService:
    name: str
    spec: ProcSpec
    depends: dict[str, str]  # service -> condition


def _mosquitto(ip: str, run_dir: Path) -> list[str]:
    conf = run_dir / "mosquitto-local.conf"
    conf.write_text(f"listener {MQTT_PORT} {ip}\nallow_anonymous true\n")
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    return [binary, "-c", str(conf)]


# Images whose containers run something other than `cmemu`: what to run locally instead.
IMAGES: dict[str, Callable[[str, Path], list[str]]] = {"eclipse-mosquitto": _mosquitto}


def _hostnames(services: dict[str, Any]) -> dict[str, str]:
    """Every service's name, hostname and network aliases, to its loopback address."""
    hosts: dict[str, str] = {}
    for ordinal, (name, svc) in enumerate(services.items()):
        ip = loopback_ip(ordinal, COMPOSE_FIRST_OCTET)
        hosts[svc.get("hostname", name)] = hosts[name] = ip
        nets = svc.get("networks") or {}
        for net in nets.values() if isinstance(nets, dict) else []:
            for alias in (net or {}).get("aliases", []):
                hosts[alias] = ip
    return hosts


class _Rehost:
    """Rewrites "host:port" to "loopback-ip:port" for the hostnames of the compose file."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = hosts

    def __call__(self, text: str) -> str:
        return re.sub(
            r"(?<![\w.-])([a-z0-9][a-z0-9-]*)(?=:\d)",
            lambda m: self.hosts.get(m.group(1), m.group(1)),
            text,
        )


def _mounts(
    services: dict[str, Any], base: Path, run_dir: Path, rehost: _Rehost, epoch: float
) -> tuple[dict[str, str], Topology]:
    """Local copies of the mounted files, by container path; the topology document rewritten to
    the loopback addresses and given the epoch."""
    mounts: dict[str, str] = {}
    topology: Topology | None = None
    for svc in services.values():
        for volume in svc.get("volumes", []):
            host_part, container_part = volume.split(":")[:2]
            source = (base / host_part).resolve()
            target = run_dir / source.name
            try:
                text = source.read_text()
            except OSError as exc:
                raise InvalidArgumentError(f"volume {volume}: {exc}") from exc
            if source.suffix == ".json":
                doc = json.loads(rehost(Topology.from_json(text).to_json()))
                topology = Topology.from_dict({**doc, "epoch_wall_s": epoch})
                text = topology.to_json()
            target.write_text(text)
            mounts[container_part] = str(target)
    if topology is None:
        raise InvalidArgumentError("the compose file mounts no topology document")
    return mounts, topology


def _private(arg: str, service: str, run_dir: Path) -> str | None:
    """A container path that nothing mounts is the container's own: a directory of its own in
    the run directory, never the host's path of the same name."""
    if not arg.startswith("/"):
        return None
    local = run_dir / "fs" / service / arg.lstrip("/")
    local.parent.mkdir(parents=True, exist_ok=True)
    return str(local)


def _service(
    name: str, svc: dict[str, Any], ctx: tuple[dict[str, str], _Rehost, dict[str, str], Path]
) -> ComposeService:
    env, rehost, mounts, run_dir = ctx
    service_env = {
        k: rehost(interpolate(str(v), env)) for k, v in (svc.get("environment") or {}).items()
    }
    command = svc.get("command")
    image = str(svc.get("image", "")).split(":")[0]
    if command:
        argv = [mounts.get(a) or _private(a, name, run_dir) or rehost(a) for a in map(str, command)]
        if argv[0] == "cmemu":
            argv[0] = str(Path(sys.executable).parent / "cmemu")
    elif image in IMAGES:
        argv = IMAGES[image](rehost.hosts[name], run_dir)
    else:
        raise InvalidArgumentError(f"service {name}: no command, and image {image!r} is unknown")
    test = (svc.get("healthcheck") or {}).get("test") or []
    probe = rehost(test[-1]) if test[1:3] == ["cmemu", "probe"] else None
    depends = svc.get("depends_on") or {}
    if isinstance(depends, list):
        depends = {d: {} for d in depends}
    return ComposeService(
        name=name,
        spec=ProcSpec(
            name=name, argv=tuple(argv), env=service_env, addresses=(probe,) if probe else ()
        ),
        depends={d: (c or {}).get("condition", "service_started") for d, c in depends.items()},
    )


def load(path: Path, env: dict[str, str], run_dir: Path) -> tuple[list[ComposeService], Topology]:
    """The services of a compose file as process specs, and the topology they will serve."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidArgumentError(f"cannot read compose file {path}: {exc}") from exc
    services: dict[str, Any] = (doc or {}).get("services") or {} if isinstance(doc, dict) else {}
    if not services:
        raise InvalidArgumentError(f"{path} has no services")
    rehost = _Rehost(_hostnames(services))
    epoch = float(interpolate("${CMEMU_EPOCH:?the launcher sets it}", env))
    mounts, topology = _mounts(services, path.parent, run_dir, rehost, epoch)
    out = [_service(n, svc, (env, rehost, mounts, run_dir)) for n, svc in services.items()]
    brokers = {s.spec.env["CMEMU_BROKER"] for s in out if "CMEMU_BROKER" in s.spec.env}
    if brokers:  # where `cmemu watch` finds the events, through the state file
        topology = dataclasses.replace(topology, broker=sorted(brokers)[0])
    for s in out:
        unknown = set(s.depends) - set(services)
        if unknown:
            raise InvalidArgumentError(f"service {s.name} depends on unknown {sorted(unknown)}")
    return out, topology


def start_order(services: list[ComposeService]) -> list[list[ComposeService]]:
    """Waves of services: each wave depends only on earlier waves (compose's depends_on)."""
    left = {s.name: s for s in services}
    done: set[str] = set()
    waves = []
    while left:
        wave = [s for s in left.values() if set(s.depends) <= done]
        if not wave:
            raise InvalidArgumentError(f"depends_on has a cycle among {sorted(left)}")
        waves.append(wave)
        done |= {s.name for s in wave}
        for s in wave:
            del left[s.name]
    return waves
