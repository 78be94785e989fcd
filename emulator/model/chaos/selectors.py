"""Target selectors: which device, die, node, link or switch a fault step hits.

A selector is one key naming what is targeted and a string saying which one:

    npu: n07-npu3                      # exactly that one
    npu: random                        # any NPU of the supernode
    npu: random in deployment decode   # an NPU of the serving deployment `decode`
    die: random in job pretrain        # a die of an NPU the job `pretrain` holds
    node: random 2 in job pretrain     # two distinct nodes of the job's NPUs
    rack: random in job pretrain       # a rack holding some of the job's NPUs (rack-power-off)
    link: random in node n03           # a link with an end in node n03
    plane: 3                           # every L2 switch of sub-plane 3 (or `random`)
    service: manager                   # a control-plane service (service-kill, -partition...)
    job: pretrain                      # a training job (checkpoint-corrupt), or `random`
    none: ""                           # kinds with no target (broker-outage)

A group (`deployment NAME`, `deployment NAME ROLE`, `job NAME`, `node ID`) is resolved from what
the runner saw when it started the workloads; randomness comes from an injected generator, so a
seed replays the same targets.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cmemu.emulator.model.chaos.units import bad
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError, NotFoundError, quote
from cmemu.emulator.model.naming import (
    SERVICES,
    DeviceKind,
    DeviceName,
    DieName,
    SwitchName,
    die_id,
    die_of,
    parse_device,
    parse_die,
    parse_id,
    parse_link,
    parse_node,
    parse_rack,
    parse_switch,
)
from cmemu.emulator.model.racks import rack_nodes, rack_of
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.model.training.spec import NAME as JOB_NAME

WHAT = (
    "npu", "die", "node", "rack", "cpu", "mempool", "device", "link", "switch", "plane", "service",
    "job", "none",
)  # fmt: skip
GROUPS = ("deployment", "job", "node")
_RANDOM = re.compile(
    r"^random(?:\s+(?P<count>[1-9][0-9]*))?(?:\s+in\s+(?P<group>[a-z]+)\s+(?P<name>\S+)"
    r"(?:\s+(?P<role>\S+))?)?$"
)


@dataclass(frozen=True, kw_only=True)
class Selector:
    """What to target (`what`, one of WHAT) and which: a literal id, or `count` at random from
    the whole supernode (group "") or from a group."""

    what: str
    literal: str = ""
    count: int = 1
    group: str = ""  # "" (the supernode), "deployment", "job", "node"
    name: str = ""  # the group's name
    role: str = ""  # deployment: "decode" or "prefill"; "" = every instance
    text: str = ""  # as written, for messages and the timeline

    @property
    def is_random(self) -> bool:
        return not self.literal


def parse_selector(raw: object, path: str) -> Selector:
    """A selector from its YAML mapping (`{npu: random in deployment decode}`)."""
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise bad(
            path,
            f"a target is one of {', '.join(WHAT)} with its selector, "
            f"e.g. {{npu: random in deployment decode}}; got {quote(raw)}",
        )
    ((what, value),) = raw.items()
    if what not in WHAT:
        raise bad(path, f"unknown target {quote(what)}; known: {', '.join(WHAT)}")
    inner = f"{path}.{what}"
    if what == "none":
        return Selector(what="none", literal="-", text="none")
    if isinstance(value, int) and not isinstance(value, bool) and what == "plane":
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise bad(inner, f"expected an id or 'random [N] [in GROUP NAME]', got {quote(value)}")
    text = " ".join(value.split())
    if what == "service" and text.startswith("random") and text != "random":
        raise bad(inner, f"a service is named, or 'random' (any of them); got {quote(text)}")
    if not text.startswith("random"):
        _check_literal(what, text, inner)
        return Selector(what=what, literal=text, text=f"{what} {text}")
    m = _RANDOM.match(text)
    if m is None:
        raise bad(
            inner, f"expected 'random [N] [in deployment|job|node NAME [ROLE]]', got {quote(text)}"
        )
    group = m["group"] or ""
    if group and group not in GROUPS:
        raise bad(inner, f"unknown group {quote(group)}; known: {', '.join(GROUPS)}")
    if m["role"] and group != "deployment":
        raise bad(inner, f"only a deployment has roles (decode, prefill), got {quote(text)}")
    if group == "node":
        _check_literal("node", m["name"], inner)
    return Selector(
        what=what,
        count=int(m["count"] or 1),
        group=group,
        name=m["name"] or "",
        role=m["role"] or "",
        text=f"{what} {text}",
    )


def _check_literal(what: str, text: str, path: str) -> None:
    parsers: dict[str, Callable[[str], object]] = {
        "npu": parse_device, "cpu": parse_device, "mempool": parse_device,
        "device": parse_device, "die": parse_die, "node": parse_node, "link": parse_link,
        "switch": parse_switch, "rack": parse_rack,
    }  # fmt: skip
    if what == "service":
        if text not in SERVICES:
            raise bad(path, f"unknown service {quote(text)}; known: {', '.join(SERVICES)}")
        return
    if what == "job":
        if not JOB_NAME.match(text):
            raise bad(path, f"a job is named by its name or 'random', got {quote(text)}")
        return
    if what == "plane":
        if not text.isdigit():
            raise bad(path, f"a plane is a number or 'random', got {quote(text)}")
        return
    try:
        parsers[what](text)
    except InvalidArgumentError as exc:  # naming says what shape it expected
        raise bad(path, str(exc)) from exc


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where the workloads run, as the runner saw it: each deployment's NPUs by role and each
    training job's NPUs."""

    deployments: Mapping[str, Mapping[str, Sequence[str]]]  # name -> role -> NPU ids
    jobs: Mapping[str, Sequence[str]]  # name -> NPU ids


NO_PLACEMENT = Placement(deployments={}, jobs={})


def _group_npus(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    if sel.group == "deployment":
        roles = placement.deployments.get(sel.name)
        if roles is None:
            raise bad(
                path,
                f"no deployment {quote(sel.name)}; the scenario's are "
                f"{sorted(placement.deployments)}",
            )
        if sel.role and sel.role not in roles:
            raise bad(
                path, f"deployment {sel.name} has no {quote(sel.role)} role; it has {sorted(roles)}"
            )
        chosen = [roles[sel.role]] if sel.role else list(roles.values())
        return sorted({npu for npus in chosen for npu in npus})
    if sel.group == "job":
        if sel.name not in placement.jobs:
            raise bad(
                path, f"no job {quote(sel.name)}; the scenario's are {sorted(placement.jobs)}"
            )
        return sorted(placement.jobs[sel.name])
    if sel.group == "node":
        return [d.id for d in topology.in_node(sel.name) if d.kind == DeviceKind.NPU]
    return [d.id for d in topology.of_kind(DeviceKind.NPU)]


_Pool = Callable[[Selector, Topology, Placement, str], list[str]]


def _group_nodes(sel: Selector, topology: Topology, placement: Placement, path: str) -> set[str]:
    if not sel.group:
        return set(topology.nodes)
    return {topology.device(n).node for n in _group_npus(sel, topology, placement, path)}


def _of_kind(kind: DeviceKind) -> _Pool:
    def pool(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
        nodes = _group_nodes(sel, topology, placement, path)
        return [d.id for d in topology.of_kind(kind) if d.node in nodes]

    return pool


def _devices(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    nodes = _group_nodes(sel, topology, placement, path)
    return [d.id for d in topology.devices if d.node in nodes]


def _services(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    return [s.kind.value for s in topology.services]


def _jobs(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    return sorted(placement.jobs)


def _planes(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    return sorted({str(s.plane) for s in topology.switches if s.tier == "l2"}, key=int)


def _switches(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    if not sel.group:
        return [s.id for s in topology.switches]
    nodes = _group_nodes(sel, topology, placement, path)
    return [s.id for s in topology.switches if s.node in nodes]


def _npus(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    return _group_npus(sel, topology, placement, path)


def _dies(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    dies = topology_dies(topology)
    return [die_id(n, d) for n in _group_npus(sel, topology, placement, path) for d in range(dies)]


def _nodes(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    return sorted(_group_nodes(sel, topology, placement, path))


def _racks(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    nodes = _group_nodes(sel, topology, placement, path)
    return sorted({rack_of(topology, n) for n in nodes})


def _links(sel: Selector, topology: Topology, placement: Placement, path: str) -> list[str]:
    """A link with an end in one of the group's nodes (its dies, devices or L1 switches)."""
    if not sel.group:
        return [link.id for link in topology.links]
    nodes = _group_nodes(sel, topology, placement, path)
    return [
        link.id for link in topology.links if _node_of(link.a) in nodes or _node_of(link.b) in nodes
    ]


# what a random selector picks from, by what it targets
POOLS: dict[str, _Pool] = {
    "npu": _npus,
    "die": _dies,
    "node": _nodes,
    "rack": _racks,
    "cpu": _of_kind(DeviceKind.CPU),
    "mempool": _of_kind(DeviceKind.MEMPOOL),
    "device": _devices,
    "link": _links,
    "switch": _switches,
    "plane": _planes,
    "service": _services,
    "job": _jobs,
}


def devices_of(what: str, target: str, topology: Topology) -> tuple[str, ...]:
    """The devices (or nodes, standing for theirs) a target takes down, for matching incidents
    and isolations to it; none for a link, switch, plane or service (or a rack that is not)."""
    if what == "rack":
        try:
            return tuple(rack_nodes(topology, target))
        except EmulatorError:
            return ()
    return (target,) if what in ("npu", "die", "node", "cpu", "mempool", "device") else ()


def _node_of(end: str) -> str | None:
    try:
        name = parse_id(end)
    except InvalidArgumentError:
        return None
    if isinstance(name, DieName):
        return name.device.node_id
    if isinstance(name, DeviceName | SwitchName):
        return name.node_id
    return None


def topology_dies(topology: Topology) -> int:
    """Dies per NPU, as the topology's links show them (die ids end in .dN)."""
    ends = (die_of(e) for link in topology.links for e in (link.a, link.b))
    dies = {end.die for end in ends if end is not None}
    return max(len(dies), 1)


def plane_switches(topology: Topology, plane: str) -> list[str]:
    return [s.id for s in topology.switches if s.tier == "l2" and str(s.plane) == plane]


def resolve(
    sel: Selector,
    topology: Topology,
    placement: Placement,
    rng: random.Random,
    *,
    path: str = "target",
) -> list[str]:
    """The concrete targets of `sel`: one or more ids (a plane is each of its L2 switches)."""
    if sel.what == "none":
        return [""]
    if sel.what == "service" and sel.literal:
        names = [s.kind.value for s in topology.services]
        if sel.literal not in names:
            raise NotFoundError(
                f"{path}: no service {quote(sel.literal)} in {topology.preset}; "
                f"its services: {', '.join(names)}",
                field=path,
                subject=sel.literal,
                reason="SERVICE_NOT_FOUND",
            )
    if sel.literal:
        chosen = [sel.literal]
    else:
        pool = POOLS[sel.what](sel, topology, placement, path)
        if len(pool) < sel.count:
            raise bad(path, f"{sel.text}: {len(pool)} candidates, {sel.count} wanted")
        chosen = rng.sample(pool, sel.count)
    if sel.what == "plane":
        return [s for plane in chosen for s in plane_switches(topology, plane)]
    return chosen
