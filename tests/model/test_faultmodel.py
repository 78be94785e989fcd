"""The fault catalogue's pure parts: a flapping link's phases in emulated time, ports degraded
for a slow device, poisoned memory that writes heal, and the typed parameters' own rules."""

from __future__ import annotations

import pytest

from cmemu.emulator.engines.device.kinds import PARAMS as DEVICE_PARAMS
from cmemu.emulator.engines.device.kinds.hbm_ecc import HbmEccParams
from cmemu.emulator.engines.device.kinds.sdc import SdcParams
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.faults.fabric import PARAMS
from cmemu.emulator.model.faults.fabric.link_flap import LinkFlapParams, flap_down, next_flip_s
from cmemu.emulator.model.faults.fabric.ports_degraded import PortsDegradedParams
from cmemu.emulator.model.faults.memory import Corruption, Poison
from cmemu.emulator.model.faults.params import NoParams, describe, params_from, params_text
from cmemu.emulator.model.linkfaults import FaultSet, FaultSpec
from cmemu.emulator.model.linkgraph import LinkGraph
from cmemu.emulator.model.topology import build

LINK = "n00-npu0.d0~n00-l1s0"


@pytest.fixture(scope="module")
def graph() -> LinkGraph:
    return LinkGraph(build("cm-mini"))


def test_a_flap_is_down_for_its_duty_then_up(graph: LinkGraph) -> None:
    spec = FaultSpec(
        kind="link-flap", params=LinkFlapParams(period_s=10, duty=0.3), target=LINK, since_s=100
    )
    assert [flap_down(spec, t) for t in (100, 102.9, 103, 109.9, 110, 113.5)] == [
        True, True, False, False, True, False,
    ]  # fmt: skip
    assert next_flip_s(spec, 100) == 103 and next_flip_s(spec, 103) == 110
    faults = FaultSet(graph)
    stored = faults.add(spec)
    a, b = graph.physical(LINK)
    assert stored.down and not graph.up[a] and not graph.up[b]
    assert faults.next_change_s(101) == 103
    assert [f.id for f in faults.flap(104)] == [stored.id] and graph.up[a]
    assert faults.flap(105) == []  # still up: nothing changed
    assert [f.id for f in faults.flap(111)] == [stored.id] and not graph.up[a]
    faults.clear(all=True)
    assert graph.up.all()


def test_durations_expire_at_their_emulated_instant(graph: LinkGraph) -> None:
    faults = FaultSet(graph)
    stored = faults.add(
        FaultSpec(kind="link-down", params=NoParams(), target=LINK, since_s=5, for_s=2)
    )
    assert faults.next_change_s(5) == 7
    assert faults.expired(6.9) == [] and faults.expired(7) == [stored.id]
    with pytest.raises(InvalidArgumentError):
        faults.add(FaultSpec(kind="link-down", params=NoParams(), target=LINK, for_s=-1))
    with pytest.raises(InvalidArgumentError):
        faults.add(
            FaultSpec(kind="link-flap", params=LinkFlapParams(period_s=0, duty=0.5), target=LINK)
        )
    faults.clear(all=True)


def test_ports_degraded_slows_a_device_or_one_die(graph: LinkGraph) -> None:
    faults = FaultSet(graph)
    faults.add(
        FaultSpec(kind="ports-degraded", params=PortsDegradedParams(factor=0.5), target="n00-npu1")
    )
    slowed = graph.factor < 1
    assert slowed.any()
    ends = {graph.ends[i] for i in range(len(graph.ends)) if slowed[i]}
    assert all("n00-npu1.d" in a or "n00-npu1.d" in b for a, b in ends)
    assert {e for pair in ends for e in pair if e.startswith("n00-npu1")} == {
        "n00-npu1.d0", "n00-npu1.d1",
    }  # fmt: skip
    faults.clear(all=True)
    faults.add(
        FaultSpec(
            kind="ports-degraded", params=PortsDegradedParams(factor=0.5), target="n00-npu1.d1"
        )
    )
    ends = {graph.ends[i] for i in range(len(graph.ends)) if graph.factor[i] < 1}
    assert all("n00-npu1.d1" in a or "n00-npu1.d1" in b for a, b in ends)
    faults.clear(all=True)
    with pytest.raises(NotFoundError):
        faults.add(
            FaultSpec(
                kind="ports-degraded", params=PortsDegradedParams(factor=0.5), target="n99-npu0"
            )
        )
    with pytest.raises(InvalidArgumentError):
        faults.add(
            FaultSpec(
                kind="ports-degraded", params=PortsDegradedParams(factor=1.5), target="n00-npu1"
            )
        )


def test_poison_merges_hits_and_heals() -> None:
    poison = Poison()
    poison.add(100, 200)
    poison.add(150, 300)
    poison.add(400, 500)
    assert poison.ranges == [(100, 300), (400, 500)] and poison.bytes == 300
    assert poison.hit(0, 100) is None and poison.hit(299, 1) == (100, 300)
    poison.heal(120, 50)  # a write in the middle splits the range
    assert poison.ranges == [(100, 120), (170, 300), (400, 500)]
    assert poison.hit(120, 50) is None
    poison.heal(0, 1000)
    assert poison.ranges == [] and poison.bytes == 0


def test_corruption_flips_only_the_bytes_of_its_ranges() -> None:
    bad = Corruption(mask=0x81)
    data = bytes(range(16))
    assert bad.flip(100, data) is data  # no range: the bytes as stored
    bad.add(104, 106)
    bad.add(110, 120)
    got = bad.flip(100, data)
    flipped = [i for i in range(16) if got[i] != data[i]]
    assert flipped == [4, 5, *range(10, 16)] and got[4] == 4 ^ 0x81
    assert bad.flip(106, data[6:10]) == data[6:10]  # between the ranges: untouched
    assert bad.flip(0, b"") == b"" and bad.bytes == 12
    bad.clear()
    assert bad.flip(100, data) == data


def test_sdc_params_name_a_region_or_a_range_and_one_byte_of_mask() -> None:
    assert params_from(SdcParams, {"region": "3"}, kind="sdc").mask == 1
    assert (
        params_from(SdcParams, {"offset": "64", "size": "8", "mask": "0xff"}, kind="sdc").mask
        == 255
    )
    for raw, field in (({}, "params.region"), ({"region": 1, "size": 8}, "params.region"),
                       ({"size": 8, "mask": 256}, "params.mask"),
                       ({"size": 8, "mask": -1}, "params.mask")):  # fmt: skip
        with pytest.raises(InvalidArgumentError) as err:
            params_from(SdcParams, raw, kind="sdc")
        assert err.value.field == field


def test_params_parse_check_and_print() -> None:
    flap = params_from(LinkFlapParams, {"period_s": "2.5"}, kind="link-flap")
    assert (flap.period_s, flap.duty) == (2.5, 0.5)
    assert params_text(flap) == {"period_s": "2.5", "duty": "0.5"}
    ecc = params_from(HbmEccParams, {"offset": "0x100", "size": 64}, kind="hbm-ecc")
    assert (ecc.offset, ecc.size) == (256, 64)
    with pytest.raises(InvalidArgumentError, match="is required"):
        params_from(PARAMS["link-latency"], {}, kind="link-latency")
    with pytest.raises(InvalidArgumentError, match="must be a number"):
        params_from(LinkFlapParams, {"period_s": True}, kind="link-flap")
    with pytest.raises(InvalidArgumentError, match="longer than 256"):
        params_from(DEVICE_PARAMS["device-down"], {"reason": "x" * 300}, kind="device-down")
    for cls in [*PARAMS.values(), *DEVICE_PARAMS.values()]:  # each documents every parameter
        assert all(help_ for *_, help_ in describe(cls))
    # (the client's kinds, orchestrator ones included: tests/client/test_faultparams.py)
