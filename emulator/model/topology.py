"""The topology: one document describing a supernode, read by every launcher.

Describe, then build: this module only produces names, ids, addresses and links (pure data, as
Mininet's Topo does). Launchers turn the document into running servers and never invent topology
of their own, so the in-process, process and compose launchers all agree on who is where.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from cmemu.emulator.model.addressplans import AddressPlan, PortPlan
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile

# re-exported: the device kinds belong to the ids, and so to naming.py
from cmemu.emulator.model.naming import DeviceKind as DeviceKind  # noqa: PLC0414
from cmemu.emulator.model.naming import (
    device_id,
    die_id,
    l1_switch_id,
    l2_switch_id,
    link_id,
    node_id,
    parse_supernode,
    service_id,
)
from cmemu.emulator.model.presets import Preset, get_preset

DOCUMENT_VERSION = 1
RACK = DEFAULT_PROFILE.node.nodes_per_rack  # nodes a rack holds, unless a document says
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class LinkKind(StrEnum):
    DIE_PORT = "die-l1"  # one of a die's 7 UB ports, to one L1 chip of its node
    DIE_TO_DIE = "die-die"  # the two dies of one NPU package
    CPU_PORT = "cpu-l1"  # a CPU socket's UB bandwidth, spread over the node's L1 chips
    POOL = "pool-cpu"  # a memory pool to a CPU whose DRAM it holds
    L1_L2 = "l1-l2"  # an L1 chip to an L2 chip of its sub-plane
    # the RDMA scale-out plane (emulator/model/scaleout.py): never UB, never in a fabric's graph
    RDMA_PORT = "die-leaf"  # a die's RDMA port, to its node's leaf
    LEAF_SPINE = "leaf-spine"  # a leaf to a spine of its supernode
    SPINE_CORE = "spine-core"  # a spine to a switch of the core tier joining the supernodes


# The link kinds of the scale-out plane: a fabric (the UB plane) never takes them.
RDMA_LINKS = frozenset({LinkKind.RDMA_PORT, LinkKind.LEAF_SPINE, LinkKind.SPINE_CORE})


def records(items: Sequence[Any]) -> list[dict[str, Any]]:
    """What dataclasses.asdict gives for the document's flat records (devices, switches, links,
    services: scalars and enums only, all of one class per list), without asdict's recursion and
    deep copy of every value: cm384's 12,672 links took it a tenth of a second, every time a
    state file is written."""
    if not items:
        return []
    names = [f.name for f in fields(items[0])]
    return [{name: getattr(x, name) for name in names} for x in items]


@dataclass(frozen=True, kw_only=True)
class Device:
    id: str
    kind: DeviceKind
    node: str
    eid: int
    address: str


class ServiceKind(StrEnum):
    FABRIC = "fabric"
    EMS = "ems"
    SCHEDULER = "scheduler"
    ROUTER = "router"
    MANAGER = "manager"  # the cluster manager (and the training jobs it hosts)
    GATEWAY = "gateway"  # the scale-out RDMA gateway (sn0-gw): only with a scale-out plane


# Services that also serve HTTP (the router's OpenAI-compatible endpoint), on an address of their
# own beside the gRPC one.
HTTP_SERVICES = frozenset({ServiceKind.ROUTER})


@dataclass(frozen=True, kw_only=True)
class Service:
    """A supernode-wide service (fabric, EMS, scheduler, router, manager): one server each."""

    id: str
    kind: ServiceKind
    address: str
    http_address: str | None = None  # host:port of its HTTP endpoint, for HTTP_SERVICES


@dataclass(frozen=True, kw_only=True)
class Switch:
    id: str
    tier: str  # "l1" or "l2"
    plane: int
    node: str | None  # the node of an L1 chip; None for L2


@dataclass(frozen=True, kw_only=True)
class Link:
    a: str
    b: str
    kind: LinkKind
    bytes_per_s: float

    @property
    def id(self) -> str:
        """The physical link's name, `a~b` (naming.py: a link has one spelling)."""
        return link_id(self.a, self.b)


@dataclass(frozen=True, kw_only=True)
class ScaleOut:
    """The RDMA scale-out plane joining the supernodes of a launch, the same in every
    supernode's document: its switches (leaves, spines, core), its links and every supernode's
    gateway. Built by emulator/model/scaleout.py; its tier sizes are assumed (HARDWARE.md)."""

    supernodes: int
    switches: tuple[Switch, ...]
    links: tuple[Link, ...]
    gateways: tuple[Service, ...]  # gateway i serves supernode i
    # sn0's fabric: emulated time starts at its epoch for every supernode (a process that is
    # given no epoch asks it, as it asks its own fabric in one supernode)
    clock: str

    def gateway(self, supernode: int) -> Service:
        if not 0 <= supernode < len(self.gateways):
            raise NotFoundError(f"no supernode sn{supernode}: the plane joins {self.supernodes}")
        return self.gateways[supernode]

    def to_dict(self) -> dict[str, Any]:
        return {
            "supernodes": self.supernodes,
            "switches": records(self.switches),
            "links": records(self.links),
            "gateways": records(self.gateways),
            "clock": self.clock,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ScaleOut:
        return cls(
            supernodes=int(doc["supernodes"]),
            switches=tuple(Switch(**s) for s in doc["switches"]),
            links=tuple(Link(**{**x, "kind": LinkKind(x["kind"])}) for x in doc["links"]),
            gateways=tuple(
                Service(**{**x, "kind": ServiceKind(x["kind"])}) for x in doc["gateways"]
            ),
            clock=str(doc["clock"]),
        )


@dataclass(frozen=True, kw_only=True)
class Topology:
    supernode: str
    preset: str
    source: str
    time_scale: float
    nodes: tuple[str, ...]
    devices: tuple[Device, ...]
    switches: tuple[Switch, ...]
    links: tuple[Link, ...]
    services: tuple[Service, ...] = ()
    epoch_wall_s: float | None = None  # set by the launcher when emulated time starts
    broker: str | None = None  # mqtt://HOST:PORT for telemetry and events; None: none
    # every process serves /metrics on this port of the host of the first server it hosts
    # (metrics_address); None: no process does
    metrics_port: int | None = None
    scaleout: ScaleOut | None = None  # the RDMA plane, in a `<base>x<N>` preset
    # emulated time slows when the emulator lags (engines/clock.py); off: wall x time_scale
    dilation: bool = True
    nodes_per_rack: int = RACK  # a rack holds this run of nodes (naming.py RackName)
    _by_id: dict[str, Device] = field(init=False, repr=False, compare=False)
    _by_eid: dict[int, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices})
        object.__setattr__(self, "_by_eid", {d.eid: d for d in self.devices})

    def device(self, device_id: str) -> Device:
        try:
            return self._by_id[device_id]
        except KeyError:
            raise NotFoundError(f"no device {quote(device_id)} in {self.preset}") from None

    def by_eid(self, eid: int) -> Device:
        try:
            return self._by_eid[eid]
        except KeyError:
            other = eid >> EID_SUPERNODE_SHIFT
            where = (
                f" (EID {eid} is of supernode sn{other}: UB never crosses supernodes, RDMA "
                "does, through the gateways)"
                if other != self.index
                else ""
            )
            raise NotFoundError(
                f"no device with EID {eid} in {self.supernode} ({self.preset}){where}"
            ) from None

    def service(self, kind: ServiceKind) -> Service:
        for service in self.services:
            if service.kind is kind:
                return service
        raise NotFoundError(f"no {kind.value} service in {self.preset}")

    @property
    def index(self) -> int:
        """This supernode's index among those of its launch (sn1 -> 1)."""
        return parse_supernode(self.supernode)

    def of_kind(self, kind: DeviceKind) -> list[Device]:
        return [d for d in self.devices if d.kind is kind]

    def in_node(self, node: str) -> list[Device]:
        return [d for d in self.devices if d.node == node]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": DOCUMENT_VERSION,
            "supernode": self.supernode,
            "preset": self.preset,
            "source": self.source,
            "time_scale": self.time_scale,
            "epoch_wall_s": self.epoch_wall_s,
            "broker": self.broker,
            "metrics_port": self.metrics_port,
            "nodes": list(self.nodes),
            "devices": records(self.devices),
            "switches": records(self.switches),
            "links": records(self.links),
            "services": records(self.services),
            **({"scaleout": self.scaleout.to_dict()} if self.scaleout else {}),
            **({} if self.dilation else {"dilation": False}),
            **({} if self.nodes_per_rack == RACK else {"nodes_per_rack": self.nodes_per_rack}),
        }

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, links: bool = True) -> Topology:
        """The topology a document describes; `links=False` leaves its links out (an empty
        tuple): a process that hosts devices only never routes (the fabric does), and cm384's
        12,672 links are 1.09 of its document's 1.12 MB, about 3 MB and 0.1 CPU s of every
        device or node process (issue 18)."""
        if doc.get("version") != DOCUMENT_VERSION:
            raise InvalidArgumentError(
                f"topology document version {doc.get('version')!r} unsupported; "
                f"expected {DOCUMENT_VERSION}"
            )
        try:
            return cls(
                supernode=doc["supernode"],
                preset=doc["preset"],
                source=doc["source"],
                time_scale=float(doc["time_scale"]),
                epoch_wall_s=doc.get("epoch_wall_s"),
                broker=doc.get("broker"),
                metrics_port=doc.get("metrics_port"),
                nodes=tuple(doc["nodes"]),
                devices=tuple(
                    Device(**{**d, "kind": DeviceKind(d["kind"])}) for d in doc["devices"]
                ),
                switches=tuple(Switch(**s) for s in doc["switches"]),
                links=tuple(Link(**{**x, "kind": LinkKind(x["kind"])}) for x in doc["links"])
                if links
                else (),
                services=tuple(
                    Service(**{**x, "kind": ServiceKind(x["kind"])})
                    for x in doc.get("services", [])
                ),
                scaleout=ScaleOut.from_dict(doc["scaleout"]) if "scaleout" in doc else None,
                dilation=bool(doc.get("dilation", True)),
                nodes_per_rack=int(doc.get("nodes_per_rack", RACK)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"malformed topology document: {exc}") from exc

    @classmethod
    def from_json(cls, text: str, *, links: bool = True) -> Topology:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"topology is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidArgumentError("topology document must be a JSON object")
        return cls.from_dict(doc, links=links)


# --- building --------------------------------------------------------------------------------


EID_SUPERNODE_SHIFT = 16  # supernode i's EIDs start at i << 16 (cm8192 uses 16,400 EIDs)


def _eid(node_index: int, slot: int, slots: int, supernode: int = 0) -> int:
    # EID 0 is never used: it is proto3's unset value, so a forgotten field cannot hit a device.
    # Every supernode has EIDs of its own: an EID of another supernode names no device of this
    # one, so a UB transaction aimed across supernodes fails (NOT_FOUND) instead of landing on
    # the device that happens to share its number.
    return (supernode << EID_SUPERNODE_SHIFT) + (node_index + 1) * slots + slot


def _slots_per_node(profile: HardwareProfile) -> int:
    needed = profile.node.npus + profile.node.cpus + 1
    return 1 << (needed - 1).bit_length()


def _node_devices(node: str, profile: HardwareProfile) -> Iterator[tuple[str, DeviceKind, int]]:
    """(id, kind, slot) of one node's devices, in a fixed order."""
    for i in range(profile.node.npus):
        yield device_id(node, DeviceKind.NPU, i), DeviceKind.NPU, i
    for i in range(profile.node.cpus):
        yield device_id(node, DeviceKind.CPU, i), DeviceKind.CPU, profile.node.npus + i
    slot = profile.node.npus + profile.node.cpus
    yield device_id(node, DeviceKind.MEMPOOL), DeviceKind.MEMPOOL, slot


def _node_links(node: str, profile: HardwareProfile) -> Iterator[Link]:
    npu, cpu, chips = profile.npu, profile.cpu, profile.node.l1_chips
    cpus = [device_id(node, DeviceKind.CPU, i) for i in range(profile.node.cpus)]
    pool = device_id(node, DeviceKind.MEMPOOL)
    for n in range(profile.node.npus):
        npu_id = device_id(node, DeviceKind.NPU, n)
        for die in range(npu.dies):
            for port in range(npu.ub_ports_per_die):
                yield Link(
                    a=die_id(npu_id, die),
                    b=l1_switch_id(node, port % chips),
                    kind=LinkKind.DIE_PORT,
                    bytes_per_s=npu.ub_port_bytes_per_s,
                )
        for die in range(1, npu.dies):
            yield Link(
                a=die_id(npu_id, die - 1),
                b=die_id(npu_id, die),
                kind=LinkKind.DIE_TO_DIE,
                bytes_per_s=npu.die_to_die_bytes_per_s,
            )
    for cpu_id in cpus:
        for chip in range(chips):
            yield Link(
                a=cpu_id,
                b=l1_switch_id(node, chip),
                kind=LinkKind.CPU_PORT,
                bytes_per_s=cpu.ub_bytes_per_s / chips,
            )
        yield Link(a=pool, b=cpu_id, kind=LinkKind.POOL, bytes_per_s=cpu.ub_bytes_per_s)


def build(
    preset: Preset | str,
    *,
    plan: AddressPlan | None = None,
    time_scale: float = 1.0,
    supernode: str = "sn0",
    profile: HardwareProfile = DEFAULT_PROFILE,
    first_ordinal: int = 0,
) -> Topology:
    """The topology document of one supernode of a preset: devices, switches and links of
    HARDWARE.md. Ids of a supernode other than sn0 carry its prefix (sn1-n00-npu0); its
    addresses start at the plan's `first_ordinal`-th (emulator/model/scaleout.py builds the
    supernodes of a `<base>x<N>` preset one after another, and their plane)."""
    spec = get_preset(preset) if isinstance(preset, str) else preset
    sn = parse_supernode(supernode)
    plan = plan or PortPlan()
    sw = profile.switch
    l2_ports = spec.l2_ports_per_chip or sw.l2_ports_per_chip
    if spec.nodes > l2_ports:
        raise InvalidArgumentError(
            f"preset {spec.name}: {spec.nodes} nodes exceed the {l2_ports} ports of an L2 chip"
        )
    if profile.node.l1_chips != sw.l2_planes:
        raise InvalidArgumentError(
            "each L1 chip belongs to one sub-plane: l1_chips must equal l2_planes"
        )
    if not time_scale > 0:
        raise InvalidArgumentError(f"time_scale must be > 0, got {time_scale}")
    slots = _slots_per_node(profile)
    if spec.scaleout and (spec.nodes + 1) * slots >= 1 << EID_SUPERNODE_SHIFT:
        raise InvalidArgumentError(
            f"preset {spec.name}: {spec.nodes} nodes need more EIDs than a supernode of a "
            "scale-out preset has"
        )
    nodes = tuple(node_id(i, supernode=sn) for i in range(spec.nodes))
    devices: list[Device] = []
    for index, node in enumerate(nodes):
        for ident, kind, slot in _node_devices(node, profile):
            devices.append(
                Device(
                    id=ident,
                    kind=kind,
                    node=node,
                    eid=_eid(index, slot, slots, sn),
                    address=plan.address(first_ordinal + len(devices), ident, slot),
                )
            )
    switches = [
        Switch(id=l1_switch_id(node, chip), tier="l1", plane=chip, node=node)
        for node in nodes
        for chip in range(profile.node.l1_chips)
    ] + [
        Switch(id=l2_switch_id(plane, chip, supernode=sn), tier="l2", plane=plane, node=None)
        for plane in range(sw.l2_planes)
        for chip in range(sw.l2_chips_per_plane)
    ]
    links = [link for node in nodes for link in _node_links(node, profile)]
    links += [
        Link(
            a=l1_switch_id(node, plane),
            b=l2_switch_id(plane, chip, supernode=sn),
            kind=LinkKind.L1_L2,
            bytes_per_s=sw.port_bytes_per_s,
        )
        for node in nodes
        for plane in range(sw.l2_planes)
        for chip in range(sw.l2_chips_per_plane)
    ]
    services = []
    kinds = [k for k in ServiceKind if spec.scaleout or k is not ServiceKind.GATEWAY]
    free = first_ordinal + len(devices) + len(kinds)  # the first ordinal no server has
    for i, service in enumerate(kinds):
        ident = service_id(service.value, supernode=sn)
        ordinal = first_ordinal + len(devices) + i
        http = None
        if service in HTTP_SERVICES:
            http = plan.http_address(ordinal, ident, free)
            free += 1
        address = plan.address(ordinal, ident, 0)
        services.append(Service(id=ident, kind=service, address=address, http_address=http))
    metrics_port = plan.metrics_port(free)
    for device in devices:
        if not DNS_LABEL.match(device.id):
            raise InvalidArgumentError(f"device id {device.id!r} is not a DNS label")
    return Topology(
        supernode=supernode,
        preset=spec.name,
        source=spec.source,
        time_scale=time_scale,
        nodes=nodes,
        devices=tuple(devices),
        switches=tuple(switches),
        links=tuple(links),
        services=tuple(services),
        metrics_port=metrics_port,
        nodes_per_rack=profile.node.nodes_per_rack,
    )


def metrics_address(topology: Topology, server_address: str) -> str | None:
    """Where the process whose first server is at `server_address` serves /metrics: that
    server's host on the topology's metrics port (None when the topology has none)."""
    if topology.metrics_port is None:
        return None
    return f"{server_address.rpartition(':')[0]}:{topology.metrics_port}"


def server_count(topology: Topology) -> int:
    """Ports a launcher binds: one per device and per supernode-wide service, and each
    service's HTTP endpoint, and the in-process supernode's /metrics."""
    http = sum(1 for x in topology.services if x.http_address)
    metrics = 1 if topology.metrics_port is not None else 0
    return len(topology.devices) + len(topology.services) + http + metrics


def summary(topology: Topology) -> str:
    """What `cmemu topology` prints: counts of devices, switches and links, and the addresses."""
    kinds = Counter(d.kind.value for d in topology.devices)
    links = Counter(link.kind.value for link in topology.links)
    tiers = Counter(s.tier for s in topology.switches)
    lines = [
        f"{topology.preset} ({topology.source}): {len(topology.nodes)} nodes"
        + (f", supernode {topology.supernode}" if topology.scaleout else ""),
        "devices   " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
        "switches  " + ", ".join(f"{n} {t}" for t, n in sorted(tiers.items())),
        "links     " + ", ".join(f"{n} {k}" for k, n in sorted(links.items())),
        f"addresses {topology.devices[0].address} .. {topology.devices[-1].address}",
    ]
    plane = topology.scaleout
    if plane is not None:
        rdma = Counter(link.kind.value for link in plane.links)
        rdma_tiers = Counter(s.tier for s in plane.switches)
        lines += [
            f"scale-out {plane.supernodes} supernodes over RDMA, gateways "
            + ", ".join(g.id for g in plane.gateways),
            "  switches " + ", ".join(f"{n} {t}" for t, n in sorted(rdma_tiers.items())),
            "  links    " + ", ".join(f"{n} {k}" for k, n in sorted(rdma.items())),
        ]
    return "\n".join(lines)
