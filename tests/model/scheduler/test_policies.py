"""The allocation policies on hand-made free maps: what each chooses, and what it refuses."""

from __future__ import annotations

import pytest

from cmemu.emulator.model.errors import UnknownNameError
from cmemu.emulator.model.naming import DeviceKind, device_id, node_id
from cmemu.emulator.model.scheduler import POLICIES, FreeNode, get_policy, place


def _nodes(free: list[int], per_rack: int = 4, capacity: int = 8) -> list[FreeNode]:
    """Node i has its first free[i] NPUs free (the last ones taken)."""
    return [
        FreeNode(
            id=node_id(i),
            rack=i // per_rack,
            order=i,
            free=tuple(device_id(node_id(i), DeviceKind.NPU, j) for j in range(n)),
            capacity=capacity,
        )
        for i, n in enumerate(free)
    ]


def _spread(npus: list[str] | None) -> list[str]:
    assert npus is not None
    return sorted({p.split("-")[0] for p in npus})


def test_the_three_policies_are_registered_and_unknown_names_list_them() -> None:
    assert set(POLICIES) == {"first-fit", "best-fit", "topology-aware"}
    assert get_policy("").name == "topology-aware"
    with pytest.raises(UnknownNameError, match="first-fit") as err:
        get_policy("random")
    assert err.value.reason == "UNKNOWN_POLICY"


def test_first_fit_takes_the_first_free_npus_in_id_order() -> None:
    nodes = _nodes([3, 8, 2])
    chosen = POLICIES["first-fit"].pick(nodes, 4)
    assert chosen == ["n00-npu0", "n00-npu1", "n00-npu2", "n01-npu0"]


def test_best_fit_takes_the_tightest_node() -> None:
    nodes = _nodes([3, 8, 2, 5])
    assert _spread(POLICIES["best-fit"].pick(nodes, 2)) == ["n02"]
    assert _spread(POLICIES["best-fit"].pick(nodes, 4)) == ["n03"]
    # larger than any node: the fullest first, then the remainder fitted tightly
    assert _spread(POLICIES["best-fit"].pick(nodes, 10)) == ["n01", "n02"]


def test_topology_aware_keeps_whole_nodes_whole_and_fills_fragments() -> None:
    # rack 0: n00..n03, rack 1: n04..n07
    nodes = _nodes([8, 8, 8, 8, 8, 3, 8, 8])
    assert _spread(POLICIES["topology-aware"].pick(nodes, 3)) == ["n05"]  # the fragment
    assert _spread(POLICIES["first-fit"].pick(nodes, 3)) == ["n00"]  # breaks a whole node
    chosen = POLICIES["topology-aware"].pick(nodes, 19)  # two whole nodes and the fragment
    assert _spread(chosen) == ["n04", "n05", "n06"]


def test_topology_aware_spans_the_fewest_racks() -> None:
    nodes = _nodes([4, 4, 4, 4, 8, 8, 8, 0, 8, 8, 0, 0])
    # rack 0 has 16 free but on 4 nodes; racks 1 and 2 hold it on 2 whole nodes: the tighter one
    chosen = POLICIES["topology-aware"].pick(nodes, 16)
    assert _spread(chosen) == ["n08", "n09"]
    big = POLICIES["topology-aware"].pick(nodes, 40)  # no rack holds 40: rack 1 and rack 2 (24+16)
    assert big is not None and {int(p[1:3]) // 4 for p in big} == {1, 2}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_honours_the_constraints_and_refuses_what_does_not_fit(name: str) -> None:
    policy = POLICIES[name]
    nodes = _nodes([5, 8, 8, 2, 8, 8, 8, 8])
    whole = place(policy, nodes, 16, whole_nodes=True, same_rack=False)
    assert whole is not None and all(len(_spread([p])) == 1 for p in whole)
    assert {p[:3] for p in whole} <= {"n01", "n02", "n04", "n05", "n06", "n07"}
    assert len({p[:3] for p in whole}) == 2
    rack = place(policy, nodes, 30, whole_nodes=False, same_rack=True)
    assert rack is not None and {int(p[1:3]) // 4 for p in rack} == {1}
    assert place(policy, nodes, 33, whole_nodes=False, same_rack=True) is None
    assert place(policy, nodes, 56, whole_nodes=True, same_rack=False) is None
    assert policy.pick(nodes, 56) is None
    assert sorted(policy.pick(nodes, 55) or []) == sorted(p for x in nodes for p in x.free)
