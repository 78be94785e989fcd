"""The RDMA plane's link graph: routes over the tiers, ECMP spread as weights, faults, and flows
timed by the same max-min simulator as the fabric's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, UnavailableError
from cmemu.emulator.model.faults.fabric.link_degraded import LinkDegradedParams
from cmemu.emulator.model.faults.gateway import PLANE
from cmemu.emulator.model.faults.params import NoParams
from cmemu.emulator.model.flowsim import LiveFlows
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.rdmafault import RdmaFault
from cmemu.emulator.model.rdmagraph import RdmaFaultSet, RdmaGraph
from cmemu.emulator.model.scaleout import build_cluster, leaf_spine_bytes_per_s

SO = DEFAULT_PROFILE.scaleout
PORT = DEFAULT_PROFILE.npu.rdma_bytes_per_s_per_die


def _graph(preset: str = "cm-minix2", profile: HardwareProfile = DEFAULT_PROFILE) -> RdmaGraph:
    plane = build_cluster(preset, profile=profile)[0].scaleout
    assert plane is not None
    return RdmaGraph(plane, profile)


def _weights(graph: RdmaGraph, resources: tuple[tuple[int, float], ...]) -> dict[str, float]:
    return {graph.names[i]: w for i, w in resources}


def test_every_plane_link_is_two_directed_links() -> None:
    g = _graph()
    plane = g.plane
    assert len(g.names) == 2 * len(plane.links)
    assert "n00-npu0.d0>n00-leaf" in g.names and "n00-leaf>n00-npu0.d0" in g.names
    assert "sn1-spine7>core15" in g.names and "core15>sn1-spine7" in g.names


def test_same_leaf_route_crosses_one_switch() -> None:
    r = _graph().route("n00-npu0.d0", "n00-npu5.d1")
    assert r.hops == ("n00-npu0.d0", "n00-leaf", "n00-npu5.d1")
    assert r.switches == 1 and r.paths == 1
    assert r.latency_s == pytest.approx(SO.latency_s(1))
    assert r.cap == pytest.approx(PORT * SO.efficiency)


def test_cross_node_route_spreads_over_the_spines() -> None:
    g = _graph()
    r = g.route("n00-npu0.d0", "n01-npu3.d1")
    assert r.switches == 3 and r.paths == SO.spines_per_supernode
    assert r.hops[1:4] == ("n00-leaf", "spine0", "n01-leaf")
    w = _weights(g, r.resources)
    assert w["n00-npu0.d0>n00-leaf"] == 1.0 and w["n01-leaf>n01-npu3.d1"] == 1.0
    for k in range(SO.spines_per_supernode):
        assert w[f"n00-leaf>spine{k}"] == pytest.approx(1 / SO.spines_per_supernode)
        assert w[f"spine{k}>n01-leaf"] == pytest.approx(1 / SO.spines_per_supernode)
    assert not any("core" in name for name in w)


def test_cross_supernode_route_crosses_the_core() -> None:
    g = _graph()
    r = g.route("n00-npu0.d0", "sn1-n01-npu3.d1")
    spines, cores = SO.spines_per_supernode, SO.core_switches
    assert r.switches == 5 and r.paths == spines * cores * spines
    assert r.hops == (
        "n00-npu0.d0",
        "n00-leaf",
        "spine0",
        "core0",
        "sn1-spine0",
        "sn1-n01-leaf",
        "sn1-n01-npu3.d1",
    )
    assert r.latency_s == pytest.approx(SO.latency_s(5))
    w = _weights(g, r.resources)
    assert w["spine2>core9"] == pytest.approx(1 / (spines * cores))
    assert w["core9>sn1-spine4"] == pytest.approx(1 / (spines * cores))
    assert w["sn1-spine4>sn1-n01-leaf"] == pytest.approx(1 / spines)
    # every tier carries the whole flow: weights per tier sum to 1
    assert sum(v for k, v in w.items() if k.startswith("core")) == pytest.approx(1.0)


def test_a_spine_down_respreads_the_route() -> None:
    g = _graph()
    faults = RdmaFaultSet(g)
    faults.add(RdmaFault(kind="switch-down", params=NoParams(), target="spine3"))
    r = g.route("n00-npu0.d0", "n01-npu3.d1")
    assert r.paths == SO.spines_per_supernode - 1
    w = _weights(g, r.resources)
    assert "n00-leaf>spine3" not in w
    assert w["n00-leaf>spine0"] == pytest.approx(1 / (SO.spines_per_supernode - 1))


def test_a_cut_route_is_unavailable() -> None:
    g = _graph()
    faults = RdmaFaultSet(g)
    fault = faults.add(
        RdmaFault(kind="link-down", params=NoParams(), target="n00-npu0.d0~n00-leaf")
    )
    with pytest.raises(UnavailableError) as port:
        g.route("n00-npu0.d0", "n01-npu3.d1")
    assert port.value.reason == "ROUTE_CUT"
    faults.clear(fault.id)
    for k in range(SO.spines_per_supernode):
        faults.add(RdmaFault(kind="link-down", params=NoParams(), target=f"n00-leaf~spine{k}"))
    with pytest.raises(UnavailableError, match="no live path"):
        g.route("n00-npu0.d0", "n01-npu3.d1")
    g.route("n00-npu0.d0", "n00-npu1.d0")  # the leaf itself still joins its own dies
    faults.clear(all=True)
    assert g.route("n00-npu0.d0", "n01-npu3.d1").paths == SO.spines_per_supernode


def test_slow_link_keeps_its_factor_of_capacity() -> None:
    g = _graph()
    faults = RdmaFaultSet(g)
    faults.add(
        RdmaFault(
            kind="link-slow", params=LinkDegradedParams(factor=0.25), target="n00-leaf~n00-npu0.d0"
        )
    )
    r = g.route("n00-npu0.d0", "n01-npu3.d1")
    assert r.cap == pytest.approx(PORT * SO.efficiency * 0.25)
    faults.add(
        RdmaFault(kind="switch-slow", params=LinkDegradedParams(factor=0.5), target="n01-leaf")
    )
    cap = g.link_cap()
    assert cap[g.names.index("n01-leaf>n01-npu3.d1")] == pytest.approx(PORT * SO.efficiency / 2)


def test_fault_inputs_are_checked() -> None:
    faults = RdmaFaultSet(_graph())
    with pytest.raises(InvalidArgumentError, match="unknown RDMA plane fault kind"):
        faults.add(RdmaFault(kind="meltdown", params=NoParams(), target="spine0"))
    with pytest.raises(NotFoundError) as link:
        faults.add(RdmaFault(kind="link-down", params=NoParams(), target="n00-npu0.d0~spine0"))
    assert link.value.reason == "LINK_NOT_FOUND"
    with pytest.raises(NotFoundError) as switch:
        faults.add(
            RdmaFault(kind="switch-down", params=NoParams(), target="l2-p0-s0")
        )  # a UB switch
    assert switch.value.reason == "SWITCH_NOT_FOUND"
    with pytest.raises(InvalidArgumentError) as other:  # another kind's params class
        faults.add(RdmaFault(kind="link-slow", params=NoParams(), target="n00-leaf~spine0"))
    assert other.value.reason == "WRONG_FAULT_PARAMS"
    with pytest.raises(InvalidArgumentError, match="factor"):
        faults.add(
            RdmaFault(
                kind="link-slow", params=LinkDegradedParams(factor=1.5), target="n00-leaf~spine0"
            )
        )
    with pytest.raises(InvalidArgumentError, match="for_s"):
        faults.add(RdmaFault(kind="switch-down", params=NoParams(), target="core1", for_s=-1))
    with pytest.raises(NotFoundError) as gone:
        faults.clear("r99")
    assert gone.value.reason == "FAULT_NOT_FOUND"
    assert set(PLANE) == {
        "link-down", "link-slow", "switch-down", "switch-slow", "partition"}  # fmt: skip
    for target, error, words in (
        ("sn0~sn2", NotFoundError, r"no supernode sn2 on this plane \(it joins sn0, sn1\)"),
        ("sn0~n01", InvalidArgumentError, "not a valid supernode id"),
        ("sn0~sn0", InvalidArgumentError, "not a valid link name"),
        ("sn0", InvalidArgumentError, "not a valid link name"),
    ):
        with pytest.raises(error, match=words):
            faults.add(RdmaFault(kind="partition", params=NoParams(), target=target))
    assert not faults.faults


def test_a_partition_cuts_two_supernodes_apart_and_no_one_else() -> None:
    g = _graph("cm-minix3")
    faults = RdmaFaultSet(g)
    fault = faults.add(RdmaFault(kind="partition", params=NoParams(), target="sn1~sn0"))
    for src, dst in (("n00-npu0.d0", "sn1-n01-npu3.d1"), ("sn1-n00-npu2.d0", "n01-npu0.d0")):
        with pytest.raises(UnavailableError, match="sn0 and sn1 are partitioned") as cut:
            g.route(src, dst)  # both ways
        assert cut.value.reason == "ROUTE_CUT"
    # the twins: each still reaches the third supernode, and within itself, at full width
    assert g.route("n00-npu0.d0", "sn2-n00-npu0.d0").paths == SO.spines_per_supernode**2 * (
        SO.core_switches
    )
    assert g.route("sn1-n00-npu0.d0", "sn2-n01-npu0.d0").paths > 0
    assert g.route("n00-npu0.d0", "n01-npu3.d1").paths == SO.spines_per_supernode
    assert g.link_cap().min() > 0  # no link went down: the plane is cut between them only
    faults.clear(fault.id)
    assert g.route("n00-npu0.d0", "sn1-n01-npu3.d1").paths > 0


def test_faults_expire_in_emulated_time() -> None:
    faults = RdmaFaultSet(_graph())
    fault = faults.add(
        RdmaFault(kind="switch-down", params=NoParams(), target="core1", for_s=2.0, since_s=1.0)
    )
    assert faults.next_change_s() == pytest.approx(3.0)
    assert faults.expired(2.9) == [] and faults.expired(3.0) == [fault.id]


def test_cpus_and_pools_have_no_rdma_port() -> None:
    g = _graph()
    with pytest.raises(NotFoundError) as cpu:
        g.route("n00-cpu0", "n01-npu0.d0")
    assert cpu.value.reason == "NO_RDMA_PORT"
    with pytest.raises(NotFoundError):
        g.route("n00-npu0.d0", "n00-mem")


def _run(
    flows: LiveFlows, starts: list[tuple[tuple[tuple[int, float], ...], float, float]]
) -> list[float]:
    """Start flows at 0 and run them to the end; each one's fluid end."""
    ends: dict[int, float] = {}
    ids = []
    for resources, cap, nbytes in starts:
        flow_id, finished = flows.add(0.0, resources, cap, nbytes)
        ids.append(flow_id)
        ends.update(finished)
    while flows.flows:
        next_s = flows.next_event_s()
        assert next_s is not None
        ends.update(flows.advance(next_s))
    return [ends[i] for i in ids]


def test_one_flow_runs_at_the_port_rate_times_efficiency() -> None:
    g = _graph()
    r = g.route("n00-npu0.d0", "sn1-n00-npu0.d0")
    (end,) = _run(LiveFlows(res_cap=g.link_cap()), [(r.resources, r.cap, 1e9)])
    assert end == pytest.approx(1e9 / (PORT * SO.efficiency))


def test_two_flows_on_an_oversubscribed_leaf_get_max_min_shares() -> None:
    # leaf uplinks carry a sixteenth of the node's RDMA rate: two dies' flows share them
    so = dataclasses.replace(DEFAULT_PROFILE.scaleout, leaf_oversubscription=16.0)
    profile = dataclasses.replace(DEFAULT_PROFILE, scaleout=so)
    g = _graph(profile=profile)
    uplink = leaf_spine_bytes_per_s(profile) * so.spines_per_supernode * so.efficiency
    a = g.route("n00-npu0.d0", "n01-npu0.d0")
    b = g.route("n00-npu1.d0", "n01-npu1.d0")
    ends = _run(
        LiveFlows(res_cap=g.link_cap()), [(a.resources, a.cap, 1e9), (b.resources, b.cap, 1e9)]
    )
    assert ends[0] == pytest.approx(1e9 / (uplink / 2))
    assert ends[1] == pytest.approx(ends[0])
    assert uplink / 2 < a.cap  # the leaf, not the port, is the bottleneck


def test_capacities_are_line_rate_times_efficiency() -> None:
    g = _graph()
    cap = g.link_cap()
    assert cap[g.names.index("n00-leaf>spine0")] == pytest.approx(
        leaf_spine_bytes_per_s(DEFAULT_PROFILE) * SO.efficiency
    )
    assert np.all(cap > 0)
