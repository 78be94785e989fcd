"""Every id of the emulator, built and parsed here and nowhere else.

    node            n07                   (sn1-n07 in supernode 1)
    rack            rack02                (the 3rd run of nodes_per_rack nodes; sn1-rack02)
    device          n07-npu3, n07-cpu1, n07-mem
    NPU die         n07-npu3.d1
    L1 switch       n07-l1s4              (the L1 chip of sub-plane 4 in node 7)
    L2 switch       l2-p3-s11             (chip 11 of sub-plane 3; sn1-l2-p3-s11 in supernode 1)
    RDMA leaf       n07-leaf              (the scale-out plane's leaf of node 7; sn1-n07-leaf)
    RDMA spine      spine3                (a spine of the supernode's scale-out tier; sn1-spine3)
    RDMA core       core5                 (the tier joining supernodes: no supernode, no prefix)
    service         fabric, ems, scheduler, router, manager (sn1-fabric ...); gateway sn0-gw
    supernode       sn0, sn1, ...

Supernode 0 takes no prefix: its ids are the short ones above, and ``sn0-n07`` is refused, so an
id has exactly one spelling. The gateway is the exception the design names: always ``sn<i>-gw``.

Links. A link is named by its two ends: ``a~b`` is the physical (full-duplex) link between a and
b, in either order; ``a>b`` is one direction of it, data flowing from a to b. The topology names
its links ``a~b``; the fabric's link statistics name directed links ``a>b``; wherever a link is
taken as input (fault targets), both spellings are accepted and a directed name means its
physical link. So any link name the emulator prints pastes back into a link fault.

Ids are DNS labels (plus the ``.`` of a die, which is a DNS name), so the same name is a compose
service, a hostname and a log field. A malformed id raises InvalidArgumentError naming the form
that was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import TypeVar

from cmemu.emulator.model.errors import InvalidArgumentError, quote

# fmt: off
__all__ = [
    "GATEWAY", "LINK", "LINK_DIRECTED", "SERVICES", "DeviceKind", "DeviceName", "DieName",
    "LinkName", "Name", "NodeName", "RackName", "ServiceName", "SwitchName", "Tier",
    "core_switch_id", "device_id", "die_id", "directed_link_id", "l1_switch_id",
    "l2_switch_id", "leaf_switch_id", "link_id", "node_id", "parse_device",
    "parse_die", "parse_endpoint", "parse_id", "parse_link", "parse_node", "parse_rack",
    "parse_service", "parse_supernode", "parse_switch", "rack_id", "service_id", "spine_switch_id",
    "supernode_id", "trunk_id",
]
# fmt: on

LINK = "~"  # a physical link: both directions
LINK_DIRECTED = ">"  # one direction of a physical link
GATEWAY = "gateway"
SERVICES = ("fabric", "ems", "scheduler", "router", "manager", GATEWAY)
_GATEWAY_TAG = "gw"


class DeviceKind(StrEnum):
    NPU = "npu"
    CPU = "cpu"
    MEMPOOL = "mempool"


class Tier(StrEnum):
    L1 = "l1"  # UB: the chips inside a node
    L2 = "l2"  # UB: the sub-planes across the nodes of a supernode
    LEAF = "leaf"  # RDMA: one per node, its NPUs' RDMA ports
    SPINE = "spine"  # RDMA: a supernode's spines, joining its leaves
    CORE = "core"  # RDMA: the tier joining the supernodes' spines


_TAG = {DeviceKind.NPU: "npu", DeviceKind.CPU: "cpu", DeviceKind.MEMPOOL: "mem"}
_KIND = {tag: kind for kind, tag in _TAG.items()}

_NUM = r"(?:0|[1-9][0-9]*)"
_PREFIX = rf"(?:sn(?P<sn>{_NUM})-)?"
_NODE = rf"{_PREFIX}n(?P<node>[0-9]{{2,}})"
_DEVICE = rf"{_NODE}-(?:(?P<tag>npu|cpu)(?P<index>{_NUM})|(?P<mem>mem))"
_RE_SUPERNODE = re.compile(rf"sn(?P<sn>{_NUM})")
_RE_NODE = re.compile(_NODE)
_RE_RACK = re.compile(rf"{_PREFIX}rack(?P<rack>[0-9]{{2,}})")
_RE_DEVICE = re.compile(_DEVICE)
_RE_DIE = re.compile(rf"{_DEVICE}\.d(?P<die>{_NUM})")
_RE_L1 = re.compile(rf"{_NODE}-l1s(?P<chip>{_NUM})")
_RE_L2 = re.compile(rf"{_PREFIX}l2-p(?P<plane>{_NUM})-s(?P<chip>{_NUM})")
_RE_LEAF = re.compile(rf"{_NODE}-leaf")
_RE_SPINE = re.compile(rf"{_PREFIX}spine(?P<chip>{_NUM})")
_RE_CORE = re.compile(rf"core(?P<chip>{_NUM})")
_RE_SERVICE = re.compile(rf"{_PREFIX}(?P<name>[a-z]+)")
_RE_END = re.compile(r"[a-z0-9][a-z0-9.-]*")  # the shape of any id, for the ends of a link

_EXPECTED = {
    "supernode id": "sn0, sn1, ...",
    "node id": "n07 (sn1-n07 in another supernode)",
    "rack id": "rack02 (sn1-rack02 in another supernode)",
    "device id": "n07-npu3, n07-cpu1 or n07-mem (sn1- prefix in another supernode)",
    "NPU die id": "n07-npu3.d1",
    "switch id": "n07-l1s4 (L1), l2-p3-s11 (L2), or on the RDMA plane n07-leaf, spine3, core5",
    "service id": f"one of {', '.join(s for s in SERVICES if s != GATEWAY)} "
    "(sn1- prefix in another supernode), or a gateway sn0-gw",
    "link name": "a~b (a physical link) or a>b (one direction of it), a and b the ids of its ends",
    "id": "a node, rack, device, die, switch or service id",
}


def _malformed(what: str, text: str, why: str = "") -> InvalidArgumentError:
    detail = f" ({why})" if why else ""
    return InvalidArgumentError(
        f"{quote(text)} is not a valid {what}{detail}; expected {_EXPECTED[what]}",
        subject=text or None,
        reason="MALFORMED_ID",
    )


def _count(value: int, what: str) -> int:
    if value < 0:
        raise InvalidArgumentError(f"{what} must be >= 0, got {value}")
    return value


def _prefix(supernode: int) -> str:
    return f"sn{supernode}-" if _count(supernode, "supernode index") else ""


_N = TypeVar("_N", bound="_Named")


def _canonical(what: str, text: str, record: _N) -> _N:
    """Refuse a second spelling of an id (n007, sn0-n07): rebuilt, it must be the same text."""
    if record.id != text:
        raise _malformed(what, text, f"its one spelling is {record.id!r}")
    return record


class _Named:
    """An id as a record: `id` rebuilds the one spelling, str() is the same."""

    @property
    def id(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.id


# --- records ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NodeName(_Named):
    index: int
    supernode: int = 0

    @property
    def id(self) -> str:
        return f"{_prefix(self.supernode)}n{_count(self.index, 'node index'):02d}"


@dataclass(frozen=True, kw_only=True)
class RackName(_Named):
    """A rack: nodes [index * per_rack, (index + 1) * per_rack) of its supernode, per_rack being
    the hardware profile's node.nodes_per_rack (the topology carries it)."""

    index: int
    supernode: int = 0

    @property
    def id(self) -> str:
        return f"{_prefix(self.supernode)}rack{_count(self.index, 'rack index'):02d}"

    def holds(self, node: NodeName, per_rack: int) -> bool:
        return node.supernode == self.supernode and node.index // per_rack == self.index


@dataclass(frozen=True, kw_only=True)
class DeviceName(_Named):
    node: int
    kind: DeviceKind
    index: int = 0  # the NPU or CPU of the node; always 0 for its memory pool
    supernode: int = 0

    @property
    def node_id(self) -> str:
        return node_id(self.node, supernode=self.supernode)

    @property
    def id(self) -> str:
        tag = _TAG[self.kind]
        if self.kind is DeviceKind.MEMPOOL:
            return f"{self.node_id}-{tag}"
        return f"{self.node_id}-{tag}{_count(self.index, 'device index')}"


@dataclass(frozen=True, kw_only=True)
class DieName(_Named):
    device: DeviceName
    die: int

    @property
    def supernode(self) -> int:
        return self.device.supernode

    @property
    def id(self) -> str:
        return f"{self.device.id}.d{_count(self.die, 'die')}"


@dataclass(frozen=True, kw_only=True)
class SwitchName(_Named):
    tier: Tier
    plane: int  # the UB sub-plane; an L1 chip serves the plane of its own number; 0 for RDMA
    chip: int
    node: int | None  # the node of an L1 chip or RDMA leaf; None for the others
    supernode: int = 0  # 0 for a core switch, which belongs to no supernode

    @property
    def node_id(self) -> str | None:
        return None if self.node is None else node_id(self.node, supernode=self.supernode)

    @property
    def id(self) -> str:
        if self.tier is Tier.L1:
            assert self.node is not None, "an L1 switch belongs to a node"
            return f"{self.node_id}-l1s{_count(self.chip, 'chip')}"
        if self.tier is Tier.LEAF:
            assert self.node is not None, "an RDMA leaf belongs to a node"
            return f"{self.node_id}-leaf"
        if self.tier is Tier.SPINE:
            return f"{_prefix(self.supernode)}spine{_count(self.chip, 'chip')}"
        if self.tier is Tier.CORE:
            return f"core{_count(self.chip, 'chip')}"
        plane, chip = _count(self.plane, "plane"), _count(self.chip, "chip")
        return f"{_prefix(self.supernode)}l2-p{plane}-s{chip}"


@dataclass(frozen=True, kw_only=True)
class ServiceName(_Named):
    kind: str  # one of SERVICES
    supernode: int = 0

    @property
    def id(self) -> str:
        if self.kind == GATEWAY:
            return f"{supernode_id(self.supernode)}-{_GATEWAY_TAG}"
        return f"{_prefix(self.supernode)}{self.kind}"


@dataclass(frozen=True, kw_only=True)
class LinkName:
    a: str
    b: str
    directed: bool = False  # a>b: one direction (data from a to b); a~b: the physical link

    @property
    def id(self) -> str:
        return (directed_link_id if self.directed else link_id)(self.a, self.b)

    @property
    def physical(self) -> str:
        """The physical link this name means (for a~b: itself)."""
        return link_id(self.a, self.b)

    def __str__(self) -> str:
        return self.id


# --- builders --------------------------------------------------------------------------------

# Pure functions of small ints and ids, spelled tens of thousands of times by a build: kept.
IDS_CACHED = 1 << 16


def supernode_id(index: int) -> str:
    return f"sn{_count(index, 'supernode index')}"


@lru_cache(maxsize=IDS_CACHED)
def node_id(index: int, *, supernode: int = 0) -> str:
    return NodeName(index=index, supernode=supernode).id


def rack_id(index: int, *, supernode: int = 0) -> str:
    return RackName(index=index, supernode=supernode).id


@lru_cache(maxsize=IDS_CACHED)
def device_id(node: str, kind: DeviceKind, index: int = 0) -> str:
    """A device of a node (the node's id carries its supernode)."""
    n = parse_node(node)
    return DeviceName(node=n.index, kind=kind, index=index, supernode=n.supernode).id


@lru_cache(maxsize=IDS_CACHED)
def die_id(npu: str, die: int) -> str:
    device = parse_device(npu)
    if device.kind is not DeviceKind.NPU:
        raise InvalidArgumentError(f"{quote(npu)} has no dies: only an NPU has", subject=npu)
    return DieName(device=device, die=die).id


@lru_cache(maxsize=IDS_CACHED)
def l1_switch_id(node: str, chip: int) -> str:
    n = parse_node(node)
    return SwitchName(tier=Tier.L1, plane=chip, chip=chip, node=n.index, supernode=n.supernode).id


@lru_cache(maxsize=IDS_CACHED)
def l2_switch_id(plane: int, chip: int, *, supernode: int = 0) -> str:
    return SwitchName(tier=Tier.L2, plane=plane, chip=chip, node=None, supernode=supernode).id


def leaf_switch_id(node: str) -> str:
    """The scale-out plane's leaf of a node: its NPU dies' RDMA ports."""
    n = parse_node(node)
    return SwitchName(tier=Tier.LEAF, plane=0, chip=0, node=n.index, supernode=n.supernode).id


def spine_switch_id(chip: int, *, supernode: int = 0) -> str:
    return SwitchName(tier=Tier.SPINE, plane=0, chip=chip, node=None, supernode=supernode).id


def core_switch_id(chip: int) -> str:
    return SwitchName(tier=Tier.CORE, plane=0, chip=chip, node=None).id


def service_id(kind: str, *, supernode: int = 0) -> str:
    if kind not in SERVICES:
        raise InvalidArgumentError(
            f"unknown service {quote(kind)}; known: {', '.join(SERVICES)}", subject=kind
        )
    return ServiceName(kind=kind, supernode=supernode).id


def link_id(a: str, b: str) -> str:
    """The physical link between a and b (the topology document's order)."""
    return f"{a}{LINK}{b}"


def directed_link_id(a: str, b: str) -> str:
    """One direction of the link between a and b: data from a to b."""
    return f"{a}{LINK_DIRECTED}{b}"


# --- parsers ---------------------------------------------------------------------------------


def _sn(match: re.Match[str]) -> int:
    sn = match["sn"]
    return int(sn) if sn is not None else 0


def parse_supernode(text: str) -> int:
    """The index of a supernode id (sn0 -> 0)."""
    match = _RE_SUPERNODE.fullmatch(text)
    if match is None:
        raise _malformed("supernode id", text)
    return int(match["sn"])


@lru_cache(maxsize=4096)
def parse_node(text: str) -> NodeName:
    match = _RE_NODE.fullmatch(text)
    if match is None:
        raise _malformed("node id", text)
    return _canonical("node id", text, NodeName(index=int(match["node"]), supernode=_sn(match)))


def parse_rack(text: str) -> RackName:
    match = _RE_RACK.fullmatch(text)
    if match is None:
        raise _malformed("rack id", text)
    return _canonical("rack id", text, RackName(index=int(match["rack"]), supernode=_sn(match)))


def _device(match: re.Match[str]) -> DeviceName:
    kind = DeviceKind.MEMPOOL if match["mem"] else _KIND[match["tag"]]
    return DeviceName(
        node=int(match["node"]),
        kind=kind,
        index=int(match["index"] or 0),
        supernode=_sn(match),
    )


@lru_cache(maxsize=16384)
def parse_device(text: str) -> DeviceName:
    match = _RE_DEVICE.fullmatch(text)
    if match is None:
        raise _malformed("device id", text)
    return _canonical("device id", text, _device(match))


@lru_cache(maxsize=16384)
def parse_die(text: str) -> DieName:
    match = _RE_DIE.fullmatch(text)
    if match is None:
        raise _malformed("NPU die id", text)
    device = _device(match)
    if device.kind is not DeviceKind.NPU:
        raise _malformed("NPU die id", text, f"a {device.kind.value} has no dies")
    return _canonical("NPU die id", text, DieName(device=device, die=int(match["die"])))


def parse_endpoint(text: str) -> DeviceName | DieName:
    """Where a transfer starts or ends: a device, or one die of an NPU."""
    return parse_die(text) if "." in text else parse_device(text)


def die_of(text: str) -> DieName | None:
    """The die `text` names; None for any other id (a device, a switch): for scanning ids of
    every kind (a link's ends) without an error per id that is not a die."""
    return parse_die(text) if _RE_DIE.fullmatch(text) else None


def device_of(endpoint: str) -> str:
    """The device an endpoint belongs to: itself, or the NPU of a die."""
    name = parse_endpoint(endpoint)
    return name.device.id if isinstance(name, DieName) else name.id


def _rdma_switch(text: str) -> SwitchName | None:
    if (match := _RE_LEAF.fullmatch(text)) is not None:
        node = int(match["node"])
        return SwitchName(tier=Tier.LEAF, plane=0, chip=0, node=node, supernode=_sn(match))
    if (match := _RE_SPINE.fullmatch(text)) is not None:
        chip = int(match["chip"])
        return SwitchName(tier=Tier.SPINE, plane=0, chip=chip, node=None, supernode=_sn(match))
    if (match := _RE_CORE.fullmatch(text)) is not None:
        return SwitchName(tier=Tier.CORE, plane=0, chip=int(match["chip"]), node=None)
    return None


@lru_cache(maxsize=4096)
def parse_switch(text: str) -> SwitchName:
    rdma = _rdma_switch(text)
    if rdma is not None:
        return _canonical("switch id", text, rdma)
    match = _RE_L1.fullmatch(text)
    if match is not None:
        chip = int(match["chip"])
        record = SwitchName(
            tier=Tier.L1, plane=chip, chip=chip, node=int(match["node"]), supernode=_sn(match)
        )
        return _canonical("switch id", text, record)
    match = _RE_L2.fullmatch(text)
    if match is None:
        raise _malformed("switch id", text)
    record = SwitchName(
        tier=Tier.L2,
        plane=int(match["plane"]),
        chip=int(match["chip"]),
        node=None,
        supernode=_sn(match),
    )
    return _canonical("switch id", text, record)


def parse_service(text: str) -> ServiceName:
    match = _RE_SERVICE.fullmatch(text)
    if match is None:
        raise _malformed("service id", text)
    name, supernode = match["name"], _sn(match)
    if name == _GATEWAY_TAG and match["sn"] is not None:
        return ServiceName(kind=GATEWAY, supernode=supernode)
    if name not in SERVICES or name == GATEWAY:
        raise _malformed("service id", text, f"no service {name!r}")
    return _canonical("service id", text, ServiceName(kind=name, supernode=supernode))


Name = NodeName | RackName | DeviceName | DieName | SwitchName | ServiceName


def parse_id(text: str) -> Name:
    """Any id: a node, rack, device, NPU die, switch or service."""
    parsers = (parse_die, parse_device, parse_switch, parse_node, parse_rack, parse_service)
    for parse in parsers:
        try:
            return parse(text)
        except InvalidArgumentError:
            continue
    raise _malformed("id", text)


def parse_link(text: str) -> LinkName:
    """`a~b` or `a>b`. Only the shape is checked here (two ends, one separator); whether such a
    link exists is for whoever holds the links to say (NotFoundError)."""
    seps = [s for s in (LINK, LINK_DIRECTED) if s in text]
    if len(seps) != 1 or text.count(seps[0]) != 1:
        raise _malformed("link name", text)
    a, b = text.split(seps[0])
    if not (_RE_END.fullmatch(a) and _RE_END.fullmatch(b)) or a == b:
        raise _malformed("link name", text)
    return LinkName(a=a, b=b, directed=seps[0] == LINK_DIRECTED)


def trunk_id(owner: str, role: str) -> str:
    """A trunk of the fabric (parallel links shared as one): an endpoint's ports `out`/`in`, a
    node's L1->L2 links `up`/`down` (n00-npu3.d1:out, n07:up). A die-to-die trunk is named by its
    directed link."""
    return f"{owner}:{role}"
