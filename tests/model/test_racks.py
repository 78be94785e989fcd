"""Racks: which nodes a rack id names (emulator/model/racks.py), carried by the topology document
when a profile's rack is not the default, and as a chaos scenario's target (selectors)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cmemu.emulator.model.chaos.selectors import NO_PLACEMENT, Placement, devices_of, parse_selector
from cmemu.emulator.model.chaos.selectors import resolve as resolve_selector
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.racks import rack_devices, rack_nodes, rack_of, racks
from cmemu.emulator.model.topology import Topology, build

PAIRS = replace(DEFAULT_PROFILE, node=replace(DEFAULT_PROFILE.node, nodes_per_rack=2))


def test_cm384_has_twelve_racks_of_four_nodes() -> None:
    topo = build("cm384")
    assert topo.nodes_per_rack == 4
    assert racks(topo) == [f"rack{i:02d}" for i in range(12)]
    assert rack_nodes(topo, "rack11") == ["n44", "n45", "n46", "n47"]
    assert rack_of(topo, "n05") == "rack01" and rack_of(topo, "n03") == "rack00"
    held = rack_devices(topo, "rack01")
    assert len(held) == 4 * (8 + 4 + 1) and {d.split("-")[0] for d in held} == {
        "n04", "n05", "n06", "n07"}  # fmt: skip
    with pytest.raises(NotFoundError, match=r"no rack 'rack12' in sn0 \(its 12: rack00"):
        rack_nodes(topo, "rack12")
    with pytest.raises(NotFoundError, match="no rack 'sn1-rack00'"):
        rack_nodes(topo, "sn1-rack00")  # a rack of another supernode
    with pytest.raises(InvalidArgumentError, match="not a valid rack id"):
        rack_nodes(topo, "rack-1")


def test_the_document_carries_a_rack_that_is_not_the_default() -> None:
    plain = build("cm-mini")
    assert "nodes_per_rack" not in plain.to_dict()  # the golden document is unchanged
    pairs = build("cm-mini", profile=PAIRS)
    assert pairs.to_dict()["nodes_per_rack"] == 2
    again = Topology.from_json(pairs.to_json())
    assert again.nodes_per_rack == 2 and again == pairs
    one = build("cm-mini", profile=replace(PAIRS, node=replace(PAIRS.node, nodes_per_rack=1)))
    assert racks(one) == ["rack00", "rack01"] and racks(plain) == ["rack00"]


def test_a_rack_as_a_scenario_target() -> None:
    topo = build("cm384")
    placement = Placement(deployments={}, jobs={"pretrain": ["n09-npu0", "n13-npu4"]})

    def pick(raw: dict[str, str], seed: int = 0) -> list[str]:
        return resolve_selector(parse_selector(raw, "t"), topo, placement, random.Random(seed))

    assert pick({"rack": "rack05"}) == ["rack05"]
    for seed in range(8):
        assert pick({"rack": "random in job pretrain"}, seed)[0] in {"rack02", "rack03"}
    assert sorted(pick({"rack": "random 2 in job pretrain"})) == ["rack02", "rack03"]
    assert pick({"rack": "random"}, 3)[0] in racks(topo)
    with pytest.raises(InvalidArgumentError, match="not a valid rack id"):
        parse_selector({"rack": "n03"}, "t")
    with pytest.raises(InvalidArgumentError, match="3 wanted"):
        resolve_selector(parse_selector({"rack": "random 3 in job pretrain"}, "t"), topo,
                         placement, random.Random(0))  # fmt: skip
    # the nodes stand for their devices when incidents are matched to the fault
    assert devices_of("rack", "rack02", topo) == ("n08", "n09", "n10", "n11")
    assert devices_of("rack", "rack99", topo) == ()  # an unknown rack failed to inject
    assert devices_of("node", "n08", topo) == ("n08",) and devices_of("link", "a~b", topo) == ()
    assert resolve_selector(parse_selector({"rack": "rack00"}, "t"), topo, NO_PLACEMENT,
                            random.Random(0)) == ["rack00"]  # fmt: skip


def test_a_training_job_as_a_scenario_target() -> None:
    topo = build("cm-mini")
    placement = Placement(deployments={}, jobs={"pretrain": ["n00-npu0"], "finetune": []})
    pick = parse_selector({"job": "pretrain"}, "t")
    assert resolve_selector(pick, topo, placement, random.Random(0)) == ["pretrain"]
    chosen = resolve_selector(parse_selector({"job": "random"}, "t"), topo, placement,
                              random.Random(1))  # fmt: skip
    assert chosen[0] in {"pretrain", "finetune"}
    with pytest.raises(InvalidArgumentError, match="a job is named by its name"):
        parse_selector({"job": "Pre Train"}, "t")
    assert devices_of("job", "pretrain", topo) == ()
