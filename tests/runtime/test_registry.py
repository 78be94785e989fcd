"""The service registry: every kind of supernode-wide service is started by every launcher."""

from __future__ import annotations

from pathlib import Path

from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.model.topology import ServiceKind, build
from cmemu.emulator.runtime.composegen import generate
from cmemu.emulator.runtime.procslaunch import proc_waves
from cmemu.emulator.runtime.registry import DEVICE_WAVE, SERVICE_SPECS, WAVES


def test_every_service_kind_is_registered() -> None:
    assert set(SERVICE_SPECS) == set(ServiceKind)
    assert all(spec.wave != DEVICE_WAVE for spec in SERVICE_SPECS.values())


def test_process_waves_follow_the_registry(tmp_path: Path) -> None:
    topology = build("cm-mini", plan=LoopbackPlan(first_octet=90))
    waves = proc_waves(topology, tmp_path / "t.json", "node")
    assert len(waves) == WAVES
    where = {spec.name: i for i, wave in enumerate(waves) for spec in wave}
    for service in topology.services:
        assert where[service.id] == SERVICE_SPECS[service.kind].wave
    assert {where[n] for n in topology.nodes} == {DEVICE_WAVE}
    # the router asks the scheduler and EMS: it starts after both
    assert where["router"] > where["scheduler"] and where["router"] > where["ems"]


def test_compose_starts_each_service_after_what_it_needs() -> None:
    text, (topology,) = generate("cm-mini", "node")
    blocks = text.split("\n\n")
    router = next(b for b in blocks if b.startswith("  router:"))
    for needed in ("fabric", "ems", "scheduler"):
        assert f"{needed}: {{condition: service_healthy}}" in router
    http = topology.service(ServiceKind.ROUTER).http_address
    assert http is not None and f"127.0.0.1:{http.rpartition(':')[2]}" in router
