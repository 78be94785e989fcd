"""Running a compose file as local processes (`cmemu up --from-compose`), without an engine.

It reads any compose file of the shape composegen writes: it gives every service a loopback
address in place of its hostname, rewrites the mounted topology document to match, and runs
exactly each service's command with its environment, in depends_on order, waiting for
healthchecks where asked.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cmemu.emulator.model.addressplans import COMPOSE_FIRST_OCTET, loopback_ip
from cmemu.emulator.model.errors import InvalidArgumentError, PreconditionError
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime.composegen import (
    MOSQUITTO_PASSWD_IN_CONTAINER,
    MOSQUITTO_QUEUES,
    MQTT_PORT,
    TOKEN_FILE,
    TOKEN_SECRET,
    write_secrets,
)
from cmemu.emulator.runtime.launchoptions import CMEMU
from cmemu.emulator.runtime.procs import ProcSpec
from cmemu.emulator.runtime.security import TOKEN_ENV, read_token, write_secret
from cmemu.emulator.runtime.serve import BROKER_ENV

SECRETS_DIR = "/run/secrets"

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


def _mosquitto(ip: str, run_dir: Path, mounts: Mapping[str, str]) -> list[str]:
    """mosquitto on the broker's loopback address; with the file's password file mounted, it
    wants that login on every connection (the devices', and the launcher's `died` events,
    `cmemu watch` and the web view log in too: nobody on the host forges an event)."""
    conf = run_dir / "mosquitto-local.conf"
    passwd = mounts.get(MOSQUITTO_PASSWD_IN_CONTAINER)
    login = (
        f"allow_anonymous false\npassword_file {passwd}\n" if passwd else "allow_anonymous true\n"
    )
    # run as whoever runs the emulator: as root, mosquitto would switch to its own user, which
    # cannot read the password file in this user's private run directory
    user = f"user {getpass.getuser()}\n"
    conf.write_text(f"listener {MQTT_PORT} {ip}\n{login}{user}{MOSQUITTO_QUEUES}")
    return [mosquitto_binary(), "-c", str(conf)]


def mosquitto_binary() -> str:
    """$CMEMU_MOSQUITTO, else mosquitto on $PATH, else in /usr/sbin (Debian puts it there, off
    a user's PATH); a PreconditionError saying what to do when there is none."""
    named = os.environ.get(MOSQUITTO_ENV)
    found = (
        shutil.which(named)
        if named
        else shutil.which("mosquitto") or shutil.which("mosquitto", path=SBIN)
    )
    if found is None:
        where = f"${MOSQUITTO_ENV}={named!r} is not an executable" if named else "not installed"
        raise PreconditionError(
            f"the compose file runs mosquitto, its MQTT broker, and mosquitto is {where}: "
            "apt-get install mosquitto (or set $CMEMU_MOSQUITTO to its path), or pass "
            "--broker none (no MQTT) or --broker mqtt://HOST:PORT (a broker of your own)"
        )
    return found


# Images whose containers run something other than `cmemu`: what to run locally instead.
# image -> argv(its loopback address, the run's directory, container path -> local file mounts)
IMAGES: dict[str, Callable[[str, Path, Mapping[str, str]], list[str]]] = {
    "eclipse-mosquitto": _mosquitto
}
BROKER_IMAGES = frozenset({"eclipse-mosquitto"})  # left out when the launcher names the broker
MOSQUITTO_ENV = "CMEMU_MOSQUITTO"
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


def names_of(name: str, svc: dict[str, Any]) -> list[str]:
    """A service's name, hostname and network aliases: the names its container answers to."""
    names = [name, str(svc.get("hostname", name))]
    nets = svc.get("networks") or {}
    for net in nets.values() if isinstance(nets, dict) else []:
        names += [str(alias) for alias in (net or {}).get("aliases", [])]
    return list(dict.fromkeys(names))


def _hostnames(services: dict[str, Any]) -> dict[str, str]:
    """Every service's name, hostname and network aliases, to its loopback address."""
    hosts: dict[str, str] = {}
    for ordinal, (name, svc) in enumerate(services.items()):
        ip = loopback_ip(ordinal, COMPOSE_FIRST_OCTET)
        hosts.update(dict.fromkeys(names_of(name, svc), ip))
    return hosts


class Rehost:
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
    services: dict[str, Any], base: Path, run_dir: Path, rehost: Rehost, epoch: float | None
) -> tuple[dict[str, str], tuple[Topology, ...]]:
    """Local copies of the mounted files, by container path; the topology documents (one per
    supernode) rewritten to the loopback addresses (and given the epoch, when there is one:
    else the fabric's serves)."""
    mounts: dict[str, str] = {}
    topologies: dict[str, Topology] = {}
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
                topology = Topology.from_dict(
                    {**doc, "epoch_wall_s": epoch or doc.get("epoch_wall_s")}
                )
                topologies[topology.supernode] = topology
                text = topology.to_json()
            target.write_text(text)
            mounts[container_part] = str(target)
    if not topologies:
        raise InvalidArgumentError("the compose file mounts no topology document")
    return mounts, tuple(sorted(topologies.values(), key=lambda t: t.index))


def _secrets(
    doc: dict[str, Any], services: dict[str, Any], base: Path, run_dir: Path
) -> dict[str, str]:
    """Local copies (0600) of the secrets services use, by their container path
    /run/secrets/NAME."""
    declared = doc.get("secrets") or {}
    mounts: dict[str, str] = {}
    for svc in services.values():
        for entry in svc.get("secrets") or []:
            name = entry if isinstance(entry, str) else entry.get("source", "")
            target = name if isinstance(entry, str) else entry.get("target", name)
            source = (declared.get(name) or {}).get("file")
            if not source:
                raise InvalidArgumentError(f"secret {name!r} has no `file` at the top level")
            try:
                text = (base / source).read_text()
            except OSError as exc:
                raise InvalidArgumentError(
                    f"secret {name}: {exc} (`cmemu compose` creates the compose file's token)"
                ) from exc
            local = run_dir / "secrets" / name
            write_secret(local, text)
            mounts[target if target.startswith("/") else f"{SECRETS_DIR}/{target}"] = str(local)
    return mounts


def token_of(services: list[ComposeService]) -> str | None:
    """The token the compose file gives its services (its secret), if any."""
    files = {s.spec.env[TOKEN_ENV] for s in services if s.spec.env.get(TOKEN_ENV)}
    return read_token(Path(sorted(files)[0])) if files else None


def private_path(arg: str, service: str, run_dir: Path) -> str | None:
    """A container path that nothing mounts is the container's own: a directory of its own in
    the run directory, never the host's path of the same name."""
    if not arg.startswith("/"):
        return None
    local = run_dir / "fs" / service / arg.lstrip("/")
    local.parent.mkdir(parents=True, exist_ok=True)
    return str(local)


def _service(
    name: str, svc: dict[str, Any], ctx: tuple[dict[str, str], Rehost, dict[str, str], Path]
) -> ComposeService:
    env, rehost, mounts, run_dir = ctx
    service_env = {  # a mounted path (a secret's) is its local copy
        k: mounts.get(str(v)) or rehost(interpolate(str(v), env))
        for k, v in (svc.get("environment") or {}).items()
    }
    command = svc.get("command")
    image = image_of(svc)
    if command:
        argv = [
            mounts.get(a) or private_path(a, name, run_dir) or rehost(a) for a in map(str, command)
        ]
        if argv[0] == "cmemu":
            argv[0] = CMEMU  # the fork server forks what runs this program
    elif image in IMAGES:
        argv = IMAGES[image](rehost.hosts[name], run_dir, mounts)
    else:
        raise InvalidArgumentError(f"service {name}: no command, and image {image!r} is unknown")
    test = (svc.get("healthcheck") or {}).get("test") or []
    probes = test[1:2] == ["cmemu-probe"] or test[1:3] == ["cmemu", "probe"]
    probe = rehost(test[-1]) if probes else None
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


def image_of(svc: dict[str, Any]) -> str:
    return str(svc.get("image", "")).split(":")[0]


def _with_broker(out: list[ComposeService], broker: str) -> list[ComposeService]:
    """Every service's $CMEMU_BROKER made `broker` (none: unset), its broker dependencies gone."""
    changed = []
    for s in out:
        env = {k: v for k, v in s.spec.env.items() if k != BROKER_ENV}
        if broker != "none":
            env[BROKER_ENV] = broker
        changed.append(dataclasses.replace(s, spec=dataclasses.replace(s.spec, env=env)))
    return changed


def load(
    path: Path, env: dict[str, str], run_dir: Path, *, broker: str | None = None
) -> tuple[list[ComposeService], tuple[Topology, ...]]:
    """The services of a compose file as process specs, and the topology documents they will
    serve (one per supernode). `broker` (a URL, or "none") takes the place of the file's own
    broker service."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidArgumentError(f"cannot read compose file {path}: {exc}") from exc
    services: dict[str, Any] = (doc or {}).get("services") or {} if isinstance(doc, dict) else {}
    if not services:
        raise InvalidArgumentError(f"{path} has no services")
    if broker is not None:
        left_out = {n for n, svc in services.items() if image_of(svc) in BROKER_IMAGES}
        services = {n: svc for n, svc in services.items() if n not in left_out}
    rehost = Rehost(_hostnames(services))
    epoch_text = interpolate("${CMEMU_EPOCH:-}", env)
    try:
        epoch = float(epoch_text) if epoch_text else None
    except ValueError:
        raise InvalidArgumentError(f"$CMEMU_EPOCH={epoch_text!r} is not a number") from None
    if (doc.get("secrets") or {}).get(TOKEN_SECRET, {}).get("file") == f"./{TOKEN_FILE}":
        write_secrets(path.parent)  # as `cmemu compose` does, when they are not there yet
    mounts, supernodes = _mounts(services, path.parent, run_dir, rehost, epoch)
    mounts |= _secrets(doc, services, path.parent, run_dir)
    out = [_service(n, svc, (env, rehost, mounts, run_dir)) for n, svc in services.items()]
    # the servers a container hosts are the topology's ids among the names it answers to
    ids = {d.id for t in supernodes for d in t.devices} | {
        x.id for t in supernodes for x in t.services
    }
    out = [
        dataclasses.replace(
            s,
            spec=dataclasses.replace(
                s.spec, servers=tuple(n for n in names_of(s.name, services[s.name]) if n in ids)
            ),
        )
        for s in out
    ]
    if broker is not None:
        out = _with_broker(out, broker)
        out = [
            dataclasses.replace(s, depends={d: c for d, c in s.depends.items() if d in services})
            for s in out
        ]
    brokers = {s.spec.env[BROKER_ENV] for s in out if BROKER_ENV in s.spec.env}
    if brokers:  # where `cmemu watch` finds the events, through the state file
        supernodes = tuple(dataclasses.replace(t, broker=sorted(brokers)[0]) for t in supernodes)
    for s in out:
        unknown = set(s.depends) - set(services)
        if unknown:
            raise InvalidArgumentError(f"service {s.name} depends on unknown {sorted(unknown)}")
    return out, supernodes


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
