"""`docker compose up` for real: a compose file of composegen's shape run through the Docker
engine, reachable from the host, its containers' deaths reported, all of it removed on exit.

The compose file is not edited: the engine runs a copy made for this run (ENGINE_FILE in the
run directory) that differs only where the host needs it to:
- every container publishes its gRPC ports (and the router its HTTP API) on a loopback address
  of its own, `127.<first_octet>.x.y`, the same port as inside, so `grpcurl` on the host reaches
  any device as it reaches a process of `--mode procs`; the state file's topology has those
  addresses (the containers keep their DNS names among themselves);
- the broker publishes a second listener on its loopback address for the host's own readers
  (`cmemu watch`, the web view, this launcher's `died` events), which log in as the containers
  do on 1883 (user MQTT_USER, the password derived from the token): nobody on the host forges
  a `died` event;
- the image is the emulator's local image, never built or pulled here (`cmemu image build`
  makes it); where the broker's own image is absent and the emulator's holds mosquitto (the
  air-gapped build), the broker runs from the emulator's image;
- the emulator's containers get NET_ADMIN, for the container-netem fault's `tc`;
- relative mounts and secrets become absolute (the copy lives elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from cmemu.emulator.client import health
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.model.address import parse_address
from cmemu.emulator.model.addressplans import ENGINE_FIRST_OCTET, loopback_ip
from cmemu.emulator.model.errors import InvalidArgumentError, PreconditionError, UnavailableError
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.runtime import composerun, image
from cmemu.emulator.runtime.composegen import MOSQUITTO_QUEUES, MQTT_PORT
from cmemu.emulator.runtime.deaths import death_reporter
from cmemu.emulator.runtime.docker import (
    DOWN_TIMEOUT_S,
    DockerEngine,
    compose_command,
    engine_version,
    run_command,
)
from cmemu.emulator.runtime.serve import clock_from_fabric, read_document

log = structlog.get_logger("cmemu.composeengine")
ENGINE_FILE = "engine-compose.yaml"
HOST_MQTT_PORT = 1884  # the broker's listener for the host's readers (with the same login)
MOSQUITTO_CONF_IN_CONTAINER = "/mosquitto/config/mosquitto.conf"
INSTANCE_LABEL = "io.cmemu.instance"
HEALTH_POLL_S = 1.0
# docker-compose's own wait for each engine call is 60 s: a busy engine (hundreds of containers
# created or removed on a few cores) takes longer, and compose then gives up half-way
COMPOSE_ENV = {"COMPOSE_HTTP_TIMEOUT": "900", "DOCKER_CLIENT_TIMEOUT": "900"}
STOP_GRACE_S = 5  # docker's SIGTERM-to-SIGKILL at down (the servers drain in 0.5 s)


@dataclass(frozen=True, kw_only=True)
class EngineRun:
    """What the engine runs for one launch: the project, its file, the topology documents as
    the host reaches them, and which servers each compose service hosts."""

    project: str
    file: Path
    supernodes: tuple[Topology, ...]
    servers: dict[str, tuple[str, ...]]  # compose service -> device and service ids
    networks: dict[str, dict[str, tuple[str, ...]]]  # service -> engine network -> aliases
    host_ips: dict[str, str]  # compose service -> its loopback address on the host
    broker_image: str


async def require_engine() -> str:
    """The engine's version; PreconditionError saying what to do when none answers."""
    version = await engine_version()
    if version is None:
        raise PreconditionError(
            "no Docker engine answers (`docker version` failed): start dockerd, or run the "
            "compose file's services as local processes with `cmemu up --from-compose FILE`",
            reason="NO_ENGINE",
        )
    return version


def _absolute(entry: str, base: Path) -> str:
    host, sep, rest = entry.partition(":")
    if host.startswith("."):
        host = str((base / host).resolve())
    return host + sep + rest


def prepare(
    compose_file: Path,
    run_dir: Path,
    *,
    project: str,
    tag: str = image.IMAGE,
    first_octet: int = ENGINE_FIRST_OCTET,
    net_admin: bool = True,
) -> EngineRun:
    """The engine's copy of `compose_file` in `run_dir`, and what the host needs to reach it."""
    try:
        doc = yaml.safe_load(compose_file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidArgumentError(f"cannot read compose file {compose_file}: {exc}") from exc
    services: dict[str, Any] = (doc or {}).get("services") or {}
    if not services:
        raise InvalidArgumentError(f"{compose_file} has no services")
    labels = image.image_labels(tag)
    if labels is None:
        raise PreconditionError(
            f"the engine has no image {tag}: build it with `cmemu image build` (with or "
            "without a registry)",
            reason="NO_IMAGE",
        )
    base = compose_file.parent.resolve()
    hosts = {
        name: loopback_ip(i, first_octet) for i, name in enumerate(services)
    }  # compose service -> host address
    names_to_ip = {n: hosts[s] for s, svc in services.items() for n in composerun.names_of(s, svc)}
    rehost = composerun.Rehost(names_to_ip)
    supernodes = _host_topologies(services, base, rehost)
    ids = {d.id for t in supernodes for d in t.devices} | {
        x.id for t in supernodes for x in t.services
    }
    servers = {
        s: tuple(n for n in composerun.names_of(s, svc) if n in ids) for s, svc in services.items()
    }
    ports = _ports(supernodes, hosts)
    networks = {s: _networks_of(project, s, svc) for s, svc in services.items()}
    broker_image = image.BROKER_IMAGE
    broker_service = _broker_service(services)
    for name, svc in services.items():
        svc.pop("build", None)
        svc["volumes"] = [_absolute(v, base) for v in svc.get("volumes") or []]
        svc.setdefault("labels", {})[INSTANCE_LABEL] = project
        if name == broker_service:
            broker_image = _broker_image(svc, tag, labels)
            svc["volumes"] = [
                v for v in svc["volumes"] if not v.endswith(MOSQUITTO_CONF_IN_CONTAINER + ":ro")
            ] + [f"{_host_mosquitto_conf(run_dir)}:{MOSQUITTO_CONF_IN_CONTAINER}:ro"]
            svc["ports"] = [f"{hosts[name]}:{HOST_MQTT_PORT}:{HOST_MQTT_PORT}"]
            continue
        svc["image"] = tag
        svc["ports"] = [f"{hosts[name]}:{p}:{p}" for p in sorted(ports.get(name, ()))]
        if net_admin:
            svc["cap_add"] = ["NET_ADMIN"]
    for secret in (doc.get("secrets") or {}).values():
        if isinstance(secret, dict) and str(secret.get("file", "")).startswith("."):
            secret["file"] = str((base / secret["file"]).resolve())
    out = run_dir / ENGINE_FILE
    out.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
    broker_url = f"mqtt://{hosts[broker_service]}:{HOST_MQTT_PORT}"
    supernodes = tuple(dataclasses.replace(t, broker=broker_url) for t in supernodes)
    return EngineRun(
        project=project,
        file=out,
        supernodes=supernodes,
        servers=servers,
        networks=networks,
        host_ips=hosts,
        broker_image=broker_image,
    )


def _networks_of(project: str, name: str, svc: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The engine's networks of a service (compose names them PROJECT_NET) and its aliases on
    each (compose gives the service's name, and the file's aliases)."""
    nets = svc.get("networks") or ["default"]
    pairs = nets.items() if isinstance(nets, dict) else ((n, None) for n in nets)
    return {
        f"{project}_{net}": (name, *[str(a) for a in ((conf or {}).get("aliases") or [])])
        for net, conf in pairs
    }


def _broker_service(services: Mapping[str, Any]) -> str:
    for name, svc in services.items():
        if composerun.image_of(svc) in composerun.BROKER_IMAGES:
            return name
    raise InvalidArgumentError("the compose file has no broker service (eclipse-mosquitto)")


def _broker_image(svc: dict[str, Any], tag: str, labels: Mapping[str, str]) -> str:
    """The broker's image: its own when the engine has it, else the emulator's when that holds
    mosquitto (the air-gapped image); else a PreconditionError."""
    own = str(svc.get("image", image.BROKER_IMAGE))
    if image.image_labels(own) is not None:
        return own
    mosquitto = labels.get(image.MOSQUITTO_LABEL)
    if not mosquitto:
        raise PreconditionError(
            f"the broker's image {own} is absent and {tag} holds no mosquitto: pull {own}, or "
            "build the emulator's image with `cmemu image build --source debootstrap` (it "
            "carries Debian's mosquitto)",
            reason="NO_BROKER_IMAGE",
        )
    svc["image"] = tag
    svc["command"] = [mosquitto, "-c", MOSQUITTO_CONF_IN_CONTAINER]
    return tag


def _host_mosquitto_conf(run_dir: Path) -> Path:
    """The broker's configuration for this run: the compose file's (passwords on 1883) plus a
    listener for the host's readers, published on loopback only, wanting the same login."""
    conf = run_dir / "mosquitto-engine.conf"
    conf.write_text(
        "per_listener_settings true\n"
        f"listener {MQTT_PORT}\nallow_anonymous false\n"
        "password_file /mosquitto/config/mosquitto.passwd\n"
        f"listener {HOST_MQTT_PORT}\nallow_anonymous false\n"
        "password_file /mosquitto/config/mosquitto.passwd\n" + MOSQUITTO_QUEUES
    )
    conf.chmod(0o644)
    return conf


def _host_topologies(
    services: Mapping[str, Any], base: Path, rehost: composerun.Rehost
) -> tuple[Topology, ...]:
    """The mounted topology documents with every DNS name replaced by its host address."""
    found: dict[str, Topology] = {}
    for svc in services.values():
        for volume in svc.get("volumes") or []:
            host_part = volume.split(":")[0]
            if not host_part.endswith(".json"):
                continue
            source = (base / host_part).resolve()
            try:
                text = read_document(source)
            except OSError as exc:
                raise InvalidArgumentError(f"volume {volume}: {exc}") from exc
            topology = Topology.from_json(rehost(Topology.from_json(text).to_json()))
            found[topology.supernode] = topology
    if not found:
        raise InvalidArgumentError("the compose file mounts no topology document")
    return tuple(sorted(found.values(), key=lambda t: t.index))


def _ports(supernodes: tuple[Topology, ...], hosts: Mapping[str, str]) -> dict[str, set[int]]:
    """Each compose service's ports to publish: those of the servers at its host address."""
    by_ip = {ip: name for name, ip in hosts.items()}
    out: dict[str, set[int]] = {}
    addresses = [d.address for t in supernodes for d in t.devices]
    addresses += [x.address for t in supernodes for x in t.services]
    addresses += [x.http_address for t in supernodes for x in t.services if x.http_address]
    for address in addresses:
        ip, port = (at := parse_address(address, any_port=True)).host, at.port
        if ip in by_ip:
            out.setdefault(by_ip[ip], set()).add(port)
    return out


# --- running ------------------------------------------------------------------------------------


def compose_argv(run: EngineRun, *args: str) -> list[str]:
    return [*compose_command(), "-p", run.project, "-f", str(run.file), *args]


async def up(run: EngineRun, *, timeout_s: float) -> None:
    """`docker compose up -d`: created and started in depends_on order (compose itself waits
    for each service_healthy condition)."""
    await run_command(compose_argv(run, "up", "-d", "--no-build"), timeout_s=timeout_s, env=_env())


def _env() -> dict[str, str]:
    return {**os.environ, **COMPOSE_ENV}


async def down(run: EngineRun, engine: DockerEngine) -> None:
    """`docker compose down -v`: every container, network and volume of the project; then a
    sweep by label of anything a failed or interrupted `down` left."""
    try:
        await run_command(
            compose_argv(run, "down", "-v", "--remove-orphans", "--timeout", str(STOP_GRACE_S)),
            timeout_s=DOWN_TIMEOUT_S,
            env=_env(),
        )
    except (PreconditionError, UnavailableError) as exc:
        log.warning("compose down failed; sweeping the project by label", error=str(exc)[-300:])
    left = await engine.sweep()
    if left:
        log.warning("removed what compose down left", project=run.project, removed=len(left))


async def wait_healthy(engine: DockerEngine, *, expected: int, timeout_s: float) -> float:
    """Until every container of the project runs and its healthcheck (if any) says healthy;
    the seconds it took. UnavailableError naming the laggards, or at once on a container that
    exited."""
    started = time.monotonic()
    while True:
        containers = await engine.containers()
        dead = [c for c in containers if c.state in ("exited", "dead")]
        if dead:
            shown = ", ".join(f"{c.service} (exit {c.exit_code})" for c in dead[:5])
            said = await _last_words(dead[0].name)
            raise UnavailableError(
                f"{len(dead)} containers exited while starting: {shown}; the end of "
                f"{dead[0].service}'s log: {said}"
            )
        waiting = [c for c in containers if c.state != "running" or c.health not in ("", "healthy")]
        if len(containers) >= expected and not waiting:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            shown = ", ".join(f"{c.service} {c.state}/{c.health}" for c in waiting[:5])
            raise UnavailableError(
                f"{len(waiting) + expected - len(containers)} containers not healthy within "
                f"{timeout_s:g} s: {shown}"
            )
        await asyncio.sleep(HEALTH_POLL_S)


async def _last_words(container: str, lines: int = 5) -> str:
    """The end of a container's log (before `down` removes it with the container)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "docker", "logs", "--tail", str(lines), container,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        async with asyncio.timeout(30):
            out, _ = await proc.communicate()
    except (OSError, TimeoutError) as exc:
        return f"(no log: {exc})"
    return " | ".join(out.decode(errors="replace").strip().splitlines())[-1500:]


async def with_epoch(run: EngineRun, credentials: Credentials) -> tuple[Topology, ...]:
    """The host's documents with the epoch sn0's fabric took when it started."""
    first = run.supernodes[0]
    clients = Clients(first, credentials)
    try:
        clock = await clock_from_fabric(clients, 60.0, first.service(ServiceKind.FABRIC).address)
    finally:
        await clients.close()
    return tuple(dataclasses.replace(t, epoch_wall_s=clock.epoch_wall_s) for t in run.supernodes)


@contextlib.asynccontextmanager
async def watch_deaths(
    run: EngineRun, engine: DockerEngine, login: Mapping[str, str] | None = None
) -> AsyncIterator[list[str]]:
    """While the block runs, every container that dies is a `died` event for each server it
    hosted (exit code from `docker events`), published on the broker; the block sees the list
    of the services that died."""
    died: list[str] = []
    async with (
        death_reporter(run.supernodes, None, login=login) as reporter,
        engine.events() as events,
    ):

        async def pump() -> None:
            while True:
                event = await events.get()
                if event.action != "die" or not event.service:
                    continue
                died.append(event.service)
                log.warning("container died", service=event.service, exit_code=event.exit_code)
                reporter.report(
                    run.servers.get(event.service, ()),
                    exit_code=event.exit_code,
                    pid=0,
                    process=event.service,
                    log=f"docker logs {event.name}",
                )

        task = asyncio.create_task(pump(), name="container-deaths")
        try:
            yield died
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def serving(run: EngineRun, *, timeout_s: float, credentials: Credentials) -> None:
    addresses = [d.address for t in run.supernodes for d in t.devices]
    addresses += [x.address for t in run.supernodes for x in t.services]
    await health.wait_serving(addresses, timeout_s=timeout_s, credentials=credentials)


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
