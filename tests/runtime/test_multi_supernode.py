"""Several supernodes in one launch (`<base>x<N>` presets), in every mode: each supernode with its
own fabric, EMS, scheduler, router, manager and gateway, all on one emulated clock."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from cmemu.emulator.client import health
from cmemu.emulator.model.addressplans import LoopbackPlan
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime import composegen
from cmemu.emulator.runtime.launchmodes import Compose, Procs
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions, Supernode
from cmemu.emulator.testing import free_port_block, launch_ports, running_supernode
from cmemu.v1 import device_pb2, fabric_pb2, ub_pb2

PRESET = "cm-minix2"


async def _check_both_supernodes(sn: Supernode) -> None:
    """Every server of both supernodes answers, each supernode its own services, one clock."""
    assert [t.supernode for t in sn.supernodes] == ["sn0", "sn1"]
    every = [d.address for t in sn.supernodes for d in t.devices]
    every += [x.address for t in sn.supernodes for x in t.services]
    statuses = await health.check_many(every, timeout_s=5.0, credentials=sn.credentials)
    assert set(statuses.values()) == {"SERVING"}, statuses
    for device in ("n01-npu7", "sn1-n01-npu7", "sn1-n00-mem"):
        info = await sn.clients.device(device).GetInfo(device_pb2.GetInfoRequest())
        assert info.id == device
    epochs = set()
    for index, topology in enumerate(sn.supernodes):
        fabric = sn.clients.supernode(index).fabric()
        clock = await fabric.GetClock(fabric_pb2.GetClockRequest())
        epochs.add(clock.epoch_wall_s)
        assert topology.service(ServiceKind.GATEWAY).id == f"sn{index}-gw"
    assert len(epochs) == 1  # the scale-out plane times flows between them on one clock
    assert sn.address("sn1-gw") == sn.supernodes[1].service(ServiceKind.GATEWAY).address


async def test_two_supernodes_run_in_one_process() -> None:
    async with running_supernode(PRESET) as sn:
        await _check_both_supernodes(sn)
        assert [x.topology.supernode for x in sn.inprocesses] == ["sn0", "sn1"]
        assert sn.local is sn.local_of(0)
        fabric1 = sn.local_of(1).fabric
        assert fabric1 is not None and fabric1.topology.supernode == "sn1"
        # one supernode's fabric knows only its own UB plane: UB never crosses supernodes
        assert all(not d.id.startswith("sn1-") for d in sn.local.topology.devices)
        assert sn.clients.supernode(1).topology.supernode == "sn1"
        with pytest.raises(NotFoundError, match="sn2"):
            sn.clients.supernode(2)
        with pytest.raises(NotFoundError, match="sn2"):
            sn.address("sn2-n00-npu0")
        # every supernode has EIDs of its own: one aimed across supernodes names nothing
        other = sn.supernodes[1].device("sn1-n00-npu1")
        assert other.eid != sn.topology.device("n00-npu1").eid
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await sn.clients.bus("n00-npu0").Submit(
                ub_pb2.UbTransaction(
                    op=ub_pb2.UB_OP_WRITE,
                    dst=ub_pb2.UbAddress(eid=other.eid, offset=0),
                    size=64,
                    size_only=True,
                )
            )
        assert refused.value.code() is grpc.StatusCode.NOT_FOUND
        assert "UB never crosses supernodes" in (refused.value.details() or "")


def test_live_launchers_refuse_more_supernodes_than_they_start() -> None:
    options = LaunchOptions(preset="cm-minix9")
    with pytest.raises(InvalidArgumentError, match="at most 8"):
        options.supernodes()


@pytest.mark.slow
async def test_two_supernodes_run_as_processes(tmp_path: Path) -> None:
    options = LaunchOptions(
        preset=PRESET,
        mode=Procs(per="node", plan=LoopbackPlan(first_octet=45), run_dir=tmp_path / "run"),
        broker=NO_BROKER,
    )
    async with Supernode.start(options) as sn:
        await _check_both_supernodes(sn)
        run = tmp_path / "run"
        assert (run / "topology.json").exists() and (run / "topology-sn1.json").exists()
        names = set(sn.supervisor.running) if sn.supervisor else set()
        assert {"sn1-n00", "sn1-gw", "sn1-ems", "n00", "sn0-gw", "ems"} <= names
        ems1 = sn.supervisor.running["sn1-ems"].spec.argv if sn.supervisor else ()
        assert str(run / "ems-ssd-sn1") in ems1  # each EMS its own SSD tier


def test_the_compose_file_of_two_supernodes_is_valid(tmp_path: Path) -> None:
    out = tmp_path / "c.yaml"
    written = composegen.write(PRESET, "node", out)
    assert [p.name for p in written] == [
        "c.yaml",
        f"{PRESET}.topology.json",
        f"{PRESET}.sn1.topology.json",
        "mosquitto.conf",
    ]
    composegen.write_secrets(tmp_path)
    check = subprocess.run(
        ["docker-compose", "-f", str(out), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    text = out.read_text()
    assert "topology-sn1.json" in text and "sn1-net0" in text and "scaleout" in text
    # sn1's fabric takes its epoch from sn0's: it starts after it
    block = next(b for b in text.split("\n\n") if b.startswith("  sn1-fabric:"))
    assert "fabric: {condition: service_healthy}" in block


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-compose")  # 127.60.x.y, compose's: see tests/conftest.py
async def test_two_supernodes_run_from_their_compose_file(tmp_path: Path) -> None:
    out = tmp_path / "compose" / "c.yaml"
    composegen.write(PRESET, "node", out)
    options = LaunchOptions(mode=Compose(file=out, run_dir=tmp_path / "run"))
    async with Supernode.start(options) as sn:
        # no $CMEMU_EPOCH: sn0's fabric took it, sn1's fabric asked it, every process its own
        await _check_both_supernodes(sn)
        clock = await sn.clients.fabric().GetClock(fabric_pb2.GetClockRequest())
        assert sn.topology.epoch_wall_s == clock.epoch_wall_s


def test_launch_ports_count_every_supernode() -> None:
    one = launch_ports("cm-minix1")
    assert launch_ports(PRESET) == 2 * one
    assert free_port_block(launch_ports(PRESET)) > 0
