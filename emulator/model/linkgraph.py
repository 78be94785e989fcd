"""The fabric's link graph: directed links with their live state, grouped into trunks, and routes.

Every physical link of the topology becomes two directed links (UB links are full duplex). The
flow model does not share each of the 25,000 directed links of a cm384 separately: a transfer is
striped over the UB planes and adaptively sprayed over a plane's L2 chips, so the shared resources
are *trunks*, groups of parallel directed links whose capacity is the sum of their live members:

- an NPU die's 7 ports out (and in), a CPU's 7 ports out (and in), a pool's links to its CPUs;
- the die-to-die link of an NPU package, each direction;
- a node's 112 L1->L2 uplinks (and downlinks), all planes.

A flow's own ceiling is per plane: a plane carries it only where both ends have a live port on
that plane, and one flow is hashed to one L2 chip per plane (ECMP), so a single cross-node flow
meets the L1->L2 link's bandwidth, which is where the calibrated cross-node loss lives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from cmemu.emulator.model.costmodel import UbOp, ub_efficiency, ub_wire_cost
from cmemu.emulator.model.endpoints import Endpoint, build_endpoints, port_tables
from cmemu.emulator.model.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    quote,
)
from cmemu.emulator.model.fairshare import weighted_sum
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.naming import (
    DieName,
    Tier,
    die_id,
    directed_link_id,
    parse_endpoint,
    parse_link,
    parse_switch,
    trunk_id,
)
from cmemu.emulator.model.route import Route
from cmemu.emulator.model.routes import find_route
from cmemu.emulator.model.topology import Device, DeviceKind, LinkKind, Topology
from cmemu.emulator.model.trunks import build_trunks

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ROUTE_CACHE_MAX = 200_000
MEMO_MAX = 4  # derived structures kept per live state (collectives.DieFlows: some MB each)
T = TypeVar("T")


class LinkGraph:
    """The one router: LinkGraph.route for one transfer (by the rules of routes.py), and for
    collectives the same rules in array form (port_caps, l2_caps, die_link, with
    route.base_latency_s, l2_plane_caps and flow_plane_caps), which collectives.DieFlows applies
    to 100,000 pairs at once."""

    def __init__(self, topology: Topology, profile: HardwareProfile = DEFAULT_PROFILE) -> None:
        self.topology = topology
        self.profile = profile
        self.version = 0  # of the live state: a timing computed at one version holds for it
        self.planes = profile.switch.l2_planes
        self.chips = profile.switch.l2_chips_per_plane
        self.names: list[str] = []  # directed links, "a>b"
        self.kinds: list[LinkKind] = []
        self.ends: list[tuple[str, str]] = []
        # "a>b" -> its index; a physical link's two directions are 2k (a>b as the topology
        # names it) and 2k + 1 (b>a), so either index finds both (physical): no second table
        self._index: dict[str, int] = {}
        self._by_switch: dict[str, list[int]] | None = None  # made by the first switch fault
        raw: list[float] = []
        eff = ub_efficiency(profile)
        loss = profile.ub.cross_node_bandwidth_loss
        # A socket's UB ports carry its published 160 GB/s one way as reads of its memory, and
        # such a read costs ub_wire_cost(READ, CPU) link bytes per payload byte on each trunk it
        # crosses: its ports are that many link bytes wide, not derated by the dies' port
        # efficiency (a die's 151 GB/s read of CPU memory is more than 160 x that efficiency).
        cpu_scale = ub_wire_cost(UbOp.READ, DeviceKind.CPU, profile)
        scales = {
            kind: cpu_scale
            if kind in (LinkKind.CPU_PORT, LinkKind.POOL)
            else eff * ((1 - loss) if kind is LinkKind.L1_L2 else 1.0)
            for kind in LinkKind
        }
        # one pass over cm384's 12,672 links, the fabric's whole start (local names: no
        # attribute lookups per link)
        names, kinds, ends, index = self.names, self.kinds, self.ends, self._index
        for link in topology.links:
            a, b, kind = link.a, link.b, link.kind
            i = len(names)
            forward, backward = directed_link_id(a, b), directed_link_id(b, a)
            index[forward], index[backward] = i, i + 1
            names += (forward, backward)
            kinds += (kind, kind)
            ends += ((a, b), (b, a))
            cap = link.bytes_per_s * scales[kind]
            raw += (cap, cap)
        self.base_cap = np.array(raw)
        self.node_row = {node: i for i, node in enumerate(topology.nodes)}
        self._switches = {s.id: parse_switch(s.id) for s in topology.switches}
        self._memo_lock = threading.Lock()
        self.reset()
        trunks = build_trunks(topology, profile, names=self.names, kinds=self.kinds, ends=self.ends)
        self.trunk_names, self._trunk_index = trunks.names, trunks.index
        self.member_link, self.member_trunk = trunks.member_link, trunks.member_trunk
        self.endpoints = build_endpoints(
            topology, profile, planes=self.planes, trunk=self.trunk,
            outgoing=self._ports(trunks.outgoing), incoming=self._ports(trunks.incoming),
        )  # fmt: skip
        self._port_cell, self._port_link = port_tables(self.endpoints, self.planes)
        self._build_l2_tables()

    # --- live state --------------------------------------------------------------------------

    def reset(self) -> None:
        """Every link up, at full bandwidth, with no added latency."""
        n = len(self.names)
        self.up = np.ones(n, dtype=bool)
        self.factor = np.ones(n)
        self.extra_latency_s = np.zeros(n)
        # (side a, side b, one way): one way, only a's frames to b are lost
        self.partitions: list[tuple[frozenset[str], frozenset[str], bool]] = []
        self.invalidate()

    def invalidate(self) -> None:
        """Forget everything derived from the live state; whoever mutates it calls this."""
        self.version += 1
        self._cache: dict[str, FloatArray] = {}
        self._routes: dict[tuple[str, str], Route] = {}
        self._dead: dict[int, tuple[Route, tuple[str, ...]]] = {}  # dead_trunks, per route
        self._memo: OrderedDict[Hashable, Any] = OrderedDict()

    def _derived(self, name: str, compute: Callable[[], FloatArray]) -> FloatArray:
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """What `compute` derives from the live state, kept until it changes (the last MEMO_MAX
        keys): the routes of a collective's ranks (collectives.DieFlows), which the fabric's
        collective threads ask for while its event loop may inject a fault. So the store is the
        one of the state the computation began in: one invalidated meanwhile is dropped with it."""
        store = self._memo
        with self._memo_lock:
            found = store.get(key)
            if found is not None:
                store.move_to_end(key)
                return found  # type: ignore[no-any-return]
        value = compute()
        with self._memo_lock:
            store[key] = value
            while len(store) > MEMO_MAX:
                store.popitem(last=False)
        return value

    def link_cap(self) -> FloatArray:
        return self._derived("link_cap", lambda: self.base_cap * self.factor * self.up)

    def physical(self, link: str) -> tuple[int, int]:
        """Both directions of a physical link, named as naming.py spells links: "a~b" (either
        order) or one of its directions "a>b", as the link statistics print them."""
        name = parse_link(link)
        i = self._index.get(directed_link_id(name.a, name.b))
        if i is None:
            raise NotFoundError(
                f"no link {quote(link)}; a link is 'a~b' or 'a>b'"
                " (cmemu links, cmemu topology --json)",
                subject=link,
                reason="LINK_NOT_FOUND",
            )
        first = i - i % 2  # the direction the topology names first (__init__)
        return first, first + 1

    def switch_links(self, switch_id: str) -> list[int]:
        parse_switch(switch_id)
        if switch_id not in self._switches:
            raise NotFoundError(
                f"no switch {quote(switch_id)}", subject=switch_id, reason="SWITCH_NOT_FOUND"
            )
        if self._by_switch is None:  # only a switch's fault asks: not kept from the start
            by_switch: dict[str, list[int]] = defaultdict(list)  # (cm384: 1.3 MiB, issue 18)
            for i, (a, b) in enumerate(self.ends):
                by_switch[a].append(i)
                by_switch[b].append(i)
            self._by_switch = by_switch
        return self._by_switch.get(switch_id, [])

    # --- trunks ------------------------------------------------------------------------------

    def trunk(self, name: str) -> int:
        return self._trunk_index[name]

    def uplink_trunk(self, node: str) -> int:
        """The trunk of a node's L1->L2 links, all planes."""
        return self._trunk_index[trunk_id(node, "up")]

    def downlink_trunk(self, node: str) -> int:
        """The trunk of a node's L2->L1 links, all planes."""
        return self._trunk_index[trunk_id(node, "down")]

    def trunk_cap(self) -> FloatArray:
        return self._derived(
            "trunk_cap",
            lambda: weighted_sum(
                self.member_trunk, self.link_cap()[self.member_link], len(self.trunk_names)
            ),
        )

    def trunk_extra_latency(self) -> FloatArray:
        """The largest added latency among a trunk's live members (data is sprayed over all)."""

        def compute() -> FloatArray:
            out = np.zeros(len(self.trunk_names))
            live = self.up[self.member_link]
            lat = self.extra_latency_s[self.member_link[live]]
            np.maximum.at(out, self.member_trunk[live], lat)
            return out

        return self._derived("trunk_extra_latency", compute)

    # --- endpoints -----------------------------------------------------------------------------

    def _ports(self, table: dict[str, list[int]]) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Each endpoint's UB ports (of `table`'s trunk members) per plane: the plane of the
        L1 chip at a port's switch end."""
        kinds = (LinkKind.DIE_PORT, LinkKind.CPU_PORT)
        plane_of = {sid: s.plane for sid, s in self._switches.items()}
        link_kinds, ends, planes = self.kinds, self.ends, self.planes
        out: dict[str, tuple[tuple[int, ...], ...]] = {}
        for name, links in table.items():
            per_plane: list[list[int]] = [[] for _ in range(planes)]
            for i in links:
                if link_kinds[i] in kinds:
                    a, b = ends[i]
                    plane = plane_of.get(b)
                    per_plane[plane_of[a] if plane is None else plane].append(i)
            out[name] = tuple(tuple(p) for p in per_plane)
        return out

    def _build_l2_tables(self) -> None:
        """Per node, plane and L2 chip: the directed L1->L2 link (up) and L2->L1 link (down)."""
        shape = (len(self.topology.nodes), self.planes, self.chips)
        up = np.full(shape, -1, dtype=np.int64)
        down = np.full(shape, -1, dtype=np.int64)
        switches, ends, node_row = self._switches, self.ends, self.node_row
        row_of_l1: dict[
            str, int
        ] = {}  # an L1 chip's node's row: looked up once per chip, not once per link
        for sid, s in switches.items():
            if s.tier is Tier.L1:
                assert s.node_id is not None
                row_of_l1[sid] = node_row[s.node_id]
        for i, kind in enumerate(self.kinds):
            if kind is not LinkKind.L1_L2:
                continue
            a, b = ends[i]
            l1, l2, table = (a, b, up) if a in row_of_l1 else (b, a, down)
            chip = switches[l2]
            table[row_of_l1[l1], chip.plane, chip.chip] = i
        self._l2_links = (up, down)
        self.l2_ids = {(s.plane, s.chip): i for i, s in self._switches.items() if s.node is None}
        self.l1_ids = {
            (s.node_id, s.plane): i for i, s in self._switches.items() if s.node is not None
        }

    def endpoint(self, name: str) -> Endpoint:
        """A device id, or an NPU die "n00-npu3.d1"; a bare NPU id means its die 0."""
        if name in self.endpoints:
            return self.endpoints[name]
        parsed = parse_endpoint(name)
        if isinstance(parsed, DieName):
            self.topology.device(parsed.device.id)
            raise OutOfRangeError(
                f"{quote(name)}: NPU dies are .d0 to .d{self.profile.npu.dies - 1}", subject=name
            )
        device = self.topology.device(parsed.id)
        return self.endpoints[die_id(device.id, 0)]

    def npu_die(self, device: Device, die: int) -> Endpoint:
        if die >= self.profile.npu.dies:
            raise OutOfRangeError(f"die {die} does not exist; an NPU has {self.profile.npu.dies}")
        return self.endpoints[die_id(device.id, die)]

    def partitioned(self, a: str, b: str) -> bool:
        """Whether frames from device `a` to device `b` are lost (a partition, either way, or
        one way from a's side to b's). No partition, no generator: asked of every transfer."""
        return bool(self.partitions) and any(
            (a in x and b in y) or (not one_way and a in y and b in x)
            for x, y, one_way in self.partitions
        )

    # --- the routing rules, as arrays over the live state ------------------------------------

    def port_caps(self, *, inbound: bool = False) -> FloatArray:
        """Per endpoint (rows: Endpoint.row) and plane, the live capacity of its UB ports out of
        it (inbound: into it)."""
        side = int(inbound)

        def compute() -> FloatArray:
            n = len(self.endpoints) * self.planes
            caps = weighted_sum(self._port_cell[side], self.link_cap()[self._port_link[side]], n)
            return caps.reshape(len(self.endpoints), self.planes)

        return self._derived(f"port_caps_{side}", compute)

    def l2_caps(self, *, down: bool = False) -> FloatArray:
        """Per node (rows: node_row), plane and L2 chip, the live capacity of the node's L1->L2
        link (down: L2->L1); 0 where it is down."""
        links = self._l2_links[int(down)]

        def compute() -> FloatArray:
            caps: FloatArray = np.where(links >= 0, self.link_cap()[links], 0.0)
            return caps

        return self._derived(f"l2_caps_{int(down)}", compute)

    def die_link(self, src: Endpoint, dst: Endpoint) -> tuple[int, float] | None:
        """The die-to-die trunk from one die of a package to its sibling, with its live
        capacity; None unless the two are dies joined by a die-to-die link."""
        if src.device.id != dst.device.id or src.name == dst.name:
            return None
        link = self._index.get(directed_link_id(src.name, dst.name))
        if link is None or self.kinds[link] is not LinkKind.DIE_TO_DIE:
            return None
        return self.trunk(self.names[link]), float(self.link_cap()[link])

    # --- routes ------------------------------------------------------------------------------

    def route(self, src: Endpoint, dst: Endpoint) -> Route:
        """The route and its uncontended ceiling; UnavailableError when nothing connects them.
        Routes are cached until the live state changes (a fault), as a switch's tables are."""
        key = (src.name, dst.name)
        route = self._routes.get(key)
        if route is None:
            if len(self._routes) >= ROUTE_CACHE_MAX:
                self._routes.clear()
            route = self._routes[key] = find_route(self, src, dst)
        return route

    def dead_trunks(self, route: Route) -> tuple[str, ...]:
        """The trunks `route` crosses with no live member left, remembered per route (the entry
        holds it) until the live state changes, as routes are: one lookup per transfer."""
        held = self._dead.get(id(route))
        if held is not None and held[0] is route:
            return held[1]
        caps = self.trunk_cap()
        dead = tuple(self.trunk_names[t] for t, _ in route.resources if caps[t] <= 0)
        if len(self._dead) >= ROUTE_CACHE_MAX:
            self._dead.clear()
        self._dead[id(route)] = (route, dead)
        return dead


def validate_ranks(graph: LinkGraph, ranks: Iterable[str]) -> list[Endpoint]:
    """Collective ranks: NPU dies; a bare NPU id stands for all its dies. No duplicates.
    Linear in the number of ranks, and at most every die of the topology is looked at."""
    dies = graph.profile.npu.dies
    most = sum(1 for d in graph.topology.devices if d.kind is DeviceKind.NPU) * dies
    out: list[Endpoint] = []
    seen: set[str] = set()
    for rank in ranks:
        parsed = parse_endpoint(rank)
        device = graph.topology.device(
            parsed.device.id if isinstance(parsed, DieName) else parsed.id
        )
        if device.kind is not DeviceKind.NPU:
            raise InvalidArgumentError(
                f"rank {quote(rank)}: collectives run on NPU dies, not on a {device.kind.value}",
                subject=rank,
            )
        if isinstance(parsed, DieName):
            found = [graph.endpoint(rank)]
        else:
            found = [graph.npu_die(device, die) for die in range(dies)]
        for endpoint in found:
            if endpoint.name in seen:
                raise InvalidArgumentError(
                    f"ranks repeat: {quote(endpoint.name)}", subject=endpoint.name
                )
            seen.add(endpoint.name)
        out += found
        if len(out) > most:  # pragma: no cover - a repeat is found first
            raise InvalidArgumentError(f"more ranks than the {most} NPU dies of the topology")
    if len(out) < 2:
        raise InvalidArgumentError("a collective needs at least 2 ranks")
    return out
