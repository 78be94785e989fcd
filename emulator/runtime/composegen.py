"""Docker compose generation: the compose file of a preset, from its topology document.

It writes YAML text directly (not a dumped dict) so that the file keeps its extension fields and
anchors, and stays readable at 600 services. Running such a file without an engine is
emulator/runtime/composerun.py.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmemu.emulator.model.address import port_of
from cmemu.emulator.model.addressplans import METRICS_PORT, DnsPlan
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.topology import Service, ServiceKind, Topology
from cmemu.emulator.runtime.registry import DEVICE_WAVE, spec_of
from cmemu.emulator.runtime.security import (
    MQTT_USER,
    mqtt_password,
    new_token,
    read_token,
    write_secret,
)
from cmemu.emulator.runtime.serve import PER, ServeKind, serve_argv

TOPOLOGY_IN_CONTAINER = "/etc/cmemu/topology.json"
EMS_SSD_IN_CONTAINER = "/var/lib/cmemu/ems-ssd"
MAX_BRIDGE_ENDPOINTS = 1000  # a Linux bridge fails past about 1,023 ports
MQTT_PORT = 1883
MEM_LIMITS = {"device": "256m", "node": "1g", "mosquitto": "256m"}  # services: the registry's
# Who may change state: the bearer token is a compose secret (TOKEN_FILE beside the compose file);
# the broker takes user MQTT_USER with mqtt_password(token), hashed in MOSQUITTO_PASSWD.
TOKEN_SECRET = "cmemu_token"
TOKEN_FILE = "cmemu.token"
SECRETS_IN_CONTAINER = "/run/secrets"
MOSQUITTO_PASSWD = "mosquitto.passwd"
MOSQUITTO_PASSWD_IN_CONTAINER = "/mosquitto/config/mosquitto.passwd"
# mosquitto's defaults drop what a burst brings: it queues 1,000 QoS 1 messages per client, and
# one supernode's `stopped` or `died` events (a few per server, thousands of servers at once)
# are more. Every mosquitto of the emulator (compose, --from-compose, the tests) runs with these.
MOSQUITTO_QUEUES = """\
# A burst of every server's events (health, stopped, died; cm8192 has 13,312 servers) reaches a
# slow subscriber: queued per subscriber in the broker's memory (about 200 bytes an event);
# past this the oldest are dropped, and mosquitto logs it.
max_queued_messages 100000
# QoS 1 messages in flight to one subscriber, not yet acknowledged (default 20)
max_inflight_messages 100
set_tcp_nodelay true
# Events are live: a restarted broker starts empty (publishers resend what it never
# acknowledged, subscribers resubscribe).
persistence false
"""
MOSQUITTO_CONF = (
    f"listener {MQTT_PORT}\nallow_anonymous false\npassword_file {MOSQUITTO_PASSWD_IN_CONTAINER}\n"
    + MOSQUITTO_QUEUES
)
PBKDF2_ITERATIONS = 101  # mosquitto_passwd's own default
# Healthchecks are `cmemu-probe` (the standard library's gRPC health check, about 22 ms of CPU;
# `cmemu probe` imported grpcio and the emulator: 0.65 s). The engine's exec of any check costs
# more than the probe: one check measured 66 ms of CPU in all (dockerd, containerd, the shim,
# runc, the probe; 42 ms for `true`) on the 2-core machine (fuse-overlayfs, cgroup v1;
# bench/containers.py). So the interval grows with the containers, to keep their checks within
# HEALTH_BUDGET_CORES: the engine runs the first check one interval after the start (Engine 20.10
# has no start_interval), which is what a healthy container waits. A check failing within the
# start period does not count (hundreds of containers importing Python at once on a few cores
# take a while to answer); one that passes makes the container healthy at once.
HEALTH_CHECK_CPU_S = 0.066
HEALTH_BUDGET_CORES = 0.15
SERVICE_HEALTH_INTERVAL_S = 10  # the few supernode-wide services: the start waits on them
HEALTH_INTERVAL_MIN_S = 10


def topology_in_container(topology: Topology) -> str:
    """Where a container finds its supernode's document (sn0's: TOPOLOGY_IN_CONTAINER)."""
    if topology.index == 0:
        return TOPOLOGY_IN_CONTAINER
    return TOPOLOGY_IN_CONTAINER.replace(".json", f"-{topology.supernode}.json")


def topology_file(preset: str, topology: Topology) -> str:
    """The document's file beside the compose file."""
    middle = "" if topology.index == 0 else f".{topology.supernode}"
    return f"{preset}{middle}.topology.json"


def _serve(kind: ServeKind, name: str, topology: Topology) -> list[str]:
    """A container's command: the same `cmemu serve` as a process of `--mode procs` runs."""
    return serve_argv(
        "cmemu", topology_in_container(topology), kind, name, ems_ssd_dir=EMS_SSD_IN_CONTAINER
    )


def _j(value: Any) -> str:
    """A YAML flow value (JSON is YAML)."""
    return json.dumps(value)


def _healthcheck(address: str, anchor: str = "healthcheck") -> str:
    return f"    healthcheck: {{<<: *{anchor}, test: {_j(['CMD', 'cmemu-probe', address])}}}"


def device_health_interval_s(containers: int) -> int:
    """The devices' healthcheck interval: their checks within HEALTH_BUDGET_CORES (a multiple
    of 5 s, at least HEALTH_INTERVAL_MIN_S)."""
    needed = containers * HEALTH_CHECK_CPU_S / HEALTH_BUDGET_CORES
    return max(HEALTH_INTERVAL_MIN_S, 5 * math.ceil(needed / 5))


def _service_block(
    service: Service, topology: Topology, nets: list[str], depends_on: list[str]
) -> list[str]:
    """A supernode-wide service's container: on every bridge, started after what it needs."""
    lines = [
        "",
        f"  {service.id}:",
        "    <<: *cmemu",
        f"    hostname: {service.id}",
        f"    command: {_j(_serve('service', service.id, topology))}",
        _healthcheck(service.address),
        f"    mem_limit: {spec_of(service.kind).mem_limit}",
    ]
    if service.http_address:  # reachable from the host, as the HTTP API is for its users
        port = port_of(service.http_address)
        lines.append(f"    ports: [{_j(f'127.0.0.1:{port}:{port}')}]")
    lines.append("    depends_on:")
    lines += [f"      {need}" for need in depends_on]
    lines.append(f"    networks: {_j(nets)}")
    return lines


@dataclass(frozen=True)
class Container:
    """A compose service to generate: what it hosts, runs and probes, and its memory."""

    name: str
    hosts: list[str]  # the device ids it serves (one, or a node's)
    argv: list[str]
    probe: str  # address its healthcheck probes
    mem: str


def compose_topologies(preset: str, per: str, time_scale: float = 1.0) -> tuple[Topology, ...]:
    """The documents of the preset's supernodes, each device addressed by its DNS name."""
    if per not in PER:
        raise InvalidArgumentError(f"--per must be one of {', '.join(PER)}")
    return build_cluster(preset, plan=DnsPlan(per_node=per == "node"), time_scale=time_scale)


def _containers(topology: Topology, per: str) -> list[Container]:
    if per == "device":
        return [
            Container(
                d.id, [d.id], _serve("device", d.id, topology), d.address, MEM_LIMITS["device"]
            )
            for d in topology.devices
        ]
    return [
        Container(
            node,
            [d.id for d in topology.in_node(node)],
            _serve("node", node, topology),
            topology.in_node(node)[0].address,
            MEM_LIMITS["node"],
        )
        for node in topology.nodes
    ]


def _networks(containers: list[Container], shared: int) -> list[list[Container]]:
    """Groups of containers, one bridge each; the broker and the `shared` supernode-wide
    services join every bridge."""
    room = MAX_BRIDGE_ENDPOINTS - shared
    return [containers[i : i + room] for i in range(0, len(containers), room)]


def generate(preset: str, per: str, time_scale: float = 1.0) -> tuple[str, tuple[Topology, ...]]:
    """The compose file's text for a preset, and the topology documents it mounts (one per
    supernode). Each supernode's containers have bridges of their own; with several, their
    supernode-wide services (the gateways among them) and the broker share a `scaleout` bridge
    too, as supernodes share the RDMA plane and sn0's clock."""
    supernodes = compose_topologies(preset, per, time_scale)
    multi = len(supernodes) > 1
    shared = ["scaleout"] if multi else []
    parts = []
    for topology in supernodes:
        containers = _containers(topology, per)
        groups = _networks(containers, 1 + len(topology.services))
        nets = [f"{topology.supernode}-net{i}" for i in range(len(groups))]
        parts.append((topology, containers, groups, nets))
    every_net = [net for *_, nets in parts for net in nets] + shared
    services = [x.id for t in supernodes for x in t.services]
    volumes = [f"./{topology_file(preset, t)}:{topology_in_container(t)}:ro" for t in supernodes]
    devices = sum(len(t.devices) for t in supernodes)
    containers_n = sum(len(c) for _, c, _, _ in parts)
    lines = [
        f"# {preset}: {devices} devices in {containers_n} containers "
        f"(one per {per}), the supernode-wide services "
        f"({', '.join(services)}) and an MQTT broker.",
        f"# Generated by `cmemu compose --preset {preset} --per {per}`; do not edit.",
        "# Run: docker compose -f <this file> up   (the fabric owns the emulated clock;",
        "# every other container asks it for the epoch, unless CMEMU_EPOCH is set for all)",
        "# The image: `cmemu image build` (with or without a registry). Reachable from the host,",
        "# its addresses in a state file: cmemu up --mode compose --from-compose <this file>",
        "# Without a Docker engine: cmemu up --from-compose <this file>",
        f"# State-changing RPCs need the token in ./{TOKEN_FILE} (a secret; the broker's password",
        "# too): `cmemu compose` writes it and ./mosquitto.passwd when absent; never commit them.",
        "",
        "x-cmemu: &cmemu",
        "  image: cloudmatrix-emulator:latest",
        "  build: {context: .., dockerfile: compose/Dockerfile}",
        '  restart: "no"',
        "  environment:",
        '    CMEMU_EPOCH: "${CMEMU_EPOCH:-}"',
        f"    CMEMU_BROKER: mqtt://mosquitto:{MQTT_PORT}",
        f"    CMEMU_MQTT_USER: {MQTT_USER}",
        f"    CMEMU_TOKEN_FILE: {SECRETS_IN_CONTAINER}/{TOKEN_SECRET}",
        f"  secrets: [{TOKEN_SECRET}]",
        f"  volumes: {_j(volumes)}",
        "  labels:  # every cmemu container serves Prometheus metrics (runtime/metrics.py)",
        '    prometheus.io/scrape: "true"',
        f'    prometheus.io/port: "{METRICS_PORT}"',
        "    prometheus.io/path: /metrics",
        "",
        "# cmemu-probe: a gRPC health check in the standard library (emulator/client/h2probe.py);",
        f"# each check costs the engine's exec too (about {HEALTH_CHECK_CPU_S * 1000:.0f} ms of "
        "CPU), so the devices' interval keeps",
        f"# their checks within {HEALTH_BUDGET_CORES:g} of a core; a container is healthy one "
        "interval after it starts",
        "x-healthcheck: &healthcheck",
        f"  interval: {SERVICE_HEALTH_INTERVAL_S}s",
        "  timeout: 10s",
        "  retries: 5",
        "  start_period: 300s",
        "",
        "x-healthcheck-device: &healthcheck-device",
        f"  interval: {device_health_interval_s(containers_n)}s",
        "  timeout: 10s",
        "  retries: 5",
        "  start_period: 300s",
    ]
    for topology in supernodes:
        lines += [
            "",
            f"x-{_device_anchor(topology)}: &{_device_anchor(topology)}",
            "  <<: *cmemu",
            "  depends_on:",
            f"    {topology.service(ServiceKind.FABRIC).id}: {{condition: service_healthy}}",
        ]
    lines += [
        "",
        "services:",
        "  mosquitto:",
        "    image: eclipse-mosquitto:2",
        "    hostname: mosquitto",
        "    volumes:",
        '      - "./mosquitto.conf:/mosquitto/config/mosquitto.conf:ro"',
        f'      - "./{MOSQUITTO_PASSWD}:{MOSQUITTO_PASSWD_IN_CONTAINER}:ro"',
        f"    mem_limit: {MEM_LIMITS['mosquitto']}",
        f"    networks: {_j(every_net)}",
    ]
    first_fabric = supernodes[0].service(ServiceKind.FABRIC).id
    for topology, containers, groups, nets in parts:
        lines += _supernode_blocks(topology, containers, groups, nets + shared, first_fabric)
    lines += ["", "networks:"] + [f"  {net}: {{}}" for net in every_net]
    lines += [
        "",
        f"secrets:  # {TOKEN_FILE}: made by `cmemu compose` when absent, never committed",
        f"  {TOKEN_SECRET}: {{file: ./{TOKEN_FILE}}}",
    ]
    return "\n".join(lines) + "\n", supernodes


def _device_anchor(topology: Topology) -> str:
    return "device" if topology.index == 0 else f"device-{topology.supernode}"


def _supernode_blocks(
    topology: Topology,
    containers: list[Container],
    groups: list[list[Container]],
    nets: list[str],
    first_fabric: str,
) -> list[str]:
    """One supernode's containers: its early services, its devices, its later services."""
    lines: list[str] = []
    early = [x for x in topology.services if spec_of(x.kind).wave < DEVICE_WAVE]
    late = [x for x in topology.services if spec_of(x.kind).wave > DEVICE_WAVE]
    for service in early:
        needs = ["mosquitto: {condition: service_started}"]
        if service.kind is ServiceKind.FABRIC and service.id != first_fabric:
            needs.append(f"{first_fabric}: {{condition: service_healthy}}")  # its epoch
        lines += _service_block(service, topology, nets, needs)
    anchor = _device_anchor(topology)
    for net, group in zip(nets, groups, strict=False):
        for c in group:
            lines += ["", f"  {c.name}:", f"    <<: *{anchor}", f"    hostname: {c.name}"]
            lines.append(f"    command: {_j(c.argv)}")
            lines.append(_healthcheck(c.probe, "healthcheck-device"))
            lines.append(f"    mem_limit: {c.mem}")
            aliases = [h for h in c.hosts if h != c.name]
            if aliases:
                lines.append(f"    networks: {{{net}: {{aliases: {_j(aliases)}}}}}")
            else:
                lines.append(f"    networks: [{net}]")
    pools = [c.name for c in containers if any(h.endswith("-mem") for h in c.hosts)]
    for service in sorted(late, key=lambda x: spec_of(x.kind).wave):
        spec = spec_of(service.kind)
        before = [x.id for x in [*early, *late] if spec_of(x.kind).wave < spec.wave]
        needs = [f"{x}: {{condition: service_healthy}}" for x in before]
        if spec.after_pools:  # its state is rebuilt from the memory pools
            needs += [f"{p}: {{condition: service_healthy}}" for p in pools]
        lines += _service_block(service, topology, nets, needs)
    return lines


def write(preset: str, per: str, out: Path, time_scale: float = 1.0) -> list[Path]:
    """The compose file, the topology document beside it, and the broker's configuration."""
    text, supernodes = generate(preset, per, time_scale)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    written = [out]
    for topology in supernodes:
        path = out.parent / topology_file(preset, topology)
        path.write_text(topology.to_json(indent=1) + "\n")
        written.append(path)
    conf = out.parent / "mosquitto.conf"
    conf.write_text(MOSQUITTO_CONF)
    return [*written, conf]


def mosquitto_passwd_line(user: str, password: str, salt: bytes | None = None) -> str:
    """One line of a mosquitto password file, as `mosquitto_passwd` writes it: PBKDF2-SHA512
    ($7$), its iterations, a random salt and the hash, base64."""
    salt = salt or secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, PBKDF2_ITERATIONS)
    b64 = base64.b64encode
    return f"{user}:$7${PBKDF2_ITERATIONS}${b64(salt).decode()}${b64(digest).decode()}\n"


def passwd_holds(line: str, user: str, password: str) -> bool:
    """Whether a mosquitto password file line (`mosquitto_passwd_line`'s) is `user` with
    `password`."""
    name, _, rest = line.strip().partition(":")
    fields = rest.split("$")
    if name != user or len(fields) != 5 or fields[1] != "7" or not fields[2].isdecimal():
        return False
    try:
        salt, digest = base64.b64decode(fields[3]), base64.b64decode(fields[4])
    except ValueError:
        return False
    again = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, int(fields[2]))
    return secrets.compare_digest(again, digest)


def write_secrets(directory: Path) -> list[Path]:
    """The compose file's token (random, 0600) and the broker's password file from it, beside
    the compose file, unless the token is there already (regenerating the compose file keeps the
    token a running deployment uses). A password file that does not hold the token's broker
    password (one written when the token itself was the password) is written anew. What it
    wrote."""
    token_path = directory / TOKEN_FILE
    passwd = directory / MOSQUITTO_PASSWD  # a salted hash: readable by the broker's own user
    if token_path.exists():
        token = read_token(token_path)
        with contextlib.suppress(OSError):
            if passwd_holds(passwd.read_text(), MQTT_USER, mqtt_password(token)):
                return []
        written = []
    else:
        token = new_token()
        write_secret(token_path, token + "\n")
        written = [token_path]
    passwd.write_text(mosquitto_passwd_line(MQTT_USER, mqtt_password(token)))
    passwd.chmod(0o644)
    return [*written, passwd]
