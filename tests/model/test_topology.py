from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from cmemu.emulator.model.addressplans import LoopbackPlan, PortPlan
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, UnknownNameError
from cmemu.emulator.model.presets import load_presets, parse_presets
from cmemu.emulator.model.topology import DNS_LABEL, DeviceKind, LinkKind, Topology, build, summary

GOLDEN = Path(__file__).parent.parent / "golden" / "cm-mini.topology.json"
SUMMARY_GOLDEN = Path(__file__).parent.parent / "golden" / "cm384.summary.txt"


def test_cm384_has_every_device_switch_and_link_of_the_hardware() -> None:
    topo = build("cm384")
    kinds = Counter(d.kind for d in topo.devices)
    assert kinds == {DeviceKind.NPU: 384, DeviceKind.CPU: 192, DeviceKind.MEMPOOL: 48}
    tiers = Counter(s.tier for s in topo.switches)
    assert tiers == {"l1": 48 * 7, "l2": 7 * 16}
    links = Counter(link.kind for link in topo.links)
    assert links[LinkKind.DIE_PORT] == 384 * 2 * 7
    assert links[LinkKind.DIE_TO_DIE] == 384
    assert links[LinkKind.L1_L2] == 48 * 7 * 16
    # every L2 chip has exactly one port per node: 48 ports, non-blocking
    l2_ports = Counter(link.b for link in topo.links if link.kind is LinkKind.L1_L2)
    assert set(l2_ports.values()) == {48}
    # each L1 chip of plane p links only to the 16 L2 chips of plane p
    for link in topo.links:
        if link.kind is LinkKind.L1_L2:
            assert link.a.endswith(f"-l1s{link.b.split('-')[1][1:]}")


@pytest.mark.parametrize("name", sorted(load_presets()))
def test_every_preset_has_unique_dns_ids_eids_and_addresses(name: str) -> None:
    topo = build(name, plan=LoopbackPlan())
    preset = load_presets()[name]
    assert len(topo.of_kind(DeviceKind.NPU)) == preset.nodes * 8
    ids = [d.id for d in topo.devices]
    eids = [d.eid for d in topo.devices]
    addresses = [d.address for d in topo.devices]
    assert len(set(ids)) == len(set(eids)) == len(set(addresses)) == len(topo.devices)
    assert all(DNS_LABEL.match(i) for i in ids)
    assert 0 not in eids


def test_smaller_supernodes_use_the_published_sizes() -> None:
    one = [p for p in load_presets().values() if p.source == "pub" and not p.scaleout]
    sizes = {p.name: p.nodes * 8 for p in one}
    assert sizes == {"cm384": 384, "cm352": 352, "cm288": 288, "cm256": 256, "cm192": 192}
    assert load_presets()["cm8192"].source == "extrapolated"


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        build("cm999")
    assert "cm384" in str(err.value) and "cm-mini" in str(err.value)


def test_port_plan_gives_consecutive_ports() -> None:
    topo = build("cm-mini", plan=PortPlan(host="127.0.0.1", base_port=30000))
    assert topo.devices[0].address == "127.0.0.1:30000"
    assert topo.devices[-1].address == f"127.0.0.1:{30000 + len(topo.devices) - 1}"
    with pytest.raises(InvalidArgumentError):
        build("cm384", plan=PortPlan(base_port=65500))


def test_document_round_trips_and_lookups() -> None:
    topo = build("cm-mini")
    again = Topology.from_json(topo.to_json())
    assert again == topo
    assert again.by_eid(topo.devices[5].eid).id == topo.devices[5].id
    with pytest.raises(NotFoundError):
        again.by_eid(0)
    with pytest.raises(NotFoundError):
        again.device("n99-npu0")


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"version": 2}', '{"version": 1, "supernode": "sn0"}'],
)
def test_malformed_documents_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Topology.from_json(text)


def test_presets_file_is_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="version"):
        parse_presets({"version": 9, "presets": {}})
    with pytest.raises(InvalidArgumentError, match="unknown keys"):
        parse_presets({"version": 1, "presets": {"x": {"nodes": 1, "gpus": 8}}})
    with pytest.raises(InvalidArgumentError, match="nodes"):
        parse_presets(
            {"version": 1, "presets": {"x": {"nodes": 0, "source": "pub", "description": ""}}}
        )


def test_cm_mini_matches_the_golden_document() -> None:
    """The whole document of cm-mini, byte for byte: any change to naming, EIDs, addresses or
    links shows up here. Regenerate with CMEMU_UPDATE_GOLDEN=1 after checking the diff."""
    current = build("cm-mini").to_json(indent=1) + "\n"
    if os.environ.get("CMEMU_UPDATE_GOLDEN"):
        GOLDEN.write_text(current)
    assert json.loads(current) == json.loads(GOLDEN.read_text())


def test_cm384_summary_matches_the_golden_file() -> None:
    """What `cmemu topology --preset cm384` prints. Regenerate with CMEMU_UPDATE_GOLDEN=1 (or
    `cmemu topology --preset cm384 > tests/golden/cm384.summary.txt`) after checking the diff."""
    current = summary(build("cm384")) + "\n"
    if os.environ.get("CMEMU_UPDATE_GOLDEN"):
        SUMMARY_GOLDEN.write_text(current)
    assert current == SUMMARY_GOLDEN.read_text()
