"""What a `cmemu serve` process holds of its topology document (issue 18): a device's or a node's
process leaves the links out (cm384: 12,672 links, 1.09 of the document's 1.12 MB); a service's
process keeps them, for the fabric's link graph and whatever else routes."""

from __future__ import annotations

import dataclasses

import pytest

from cmemu.emulator.model.topology import Topology, build
from cmemu.emulator.runtime.serve import ServeKind, load_topology


def test_a_document_read_without_links_is_the_same_but_for_them() -> None:
    topo = build("cm-mini")
    assert topo.links
    text = topo.to_json()
    assert Topology.from_json(text) == topo  # by default, everything
    bare = Topology.from_json(text, links=False)
    assert bare.links == ()
    assert bare == dataclasses.replace(topo, links=())
    assert bare != topo


@pytest.mark.parametrize(("kind", "kept"), [("device", False), ("node", False), ("service", True)])
def test_only_a_service_s_process_keeps_the_links(kind: ServeKind, kept: bool) -> None:
    topo = build("cm-mini")
    held = load_topology(topo.to_json(), kind)
    assert (held.links == topo.links) is kept
    assert bool(held.links) is kept
    assert held.devices == topo.devices and held.services == topo.services
    assert held.switches == topo.switches
