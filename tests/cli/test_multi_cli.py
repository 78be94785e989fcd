"""`cmemu up --preset cm-minix2`: the CLI drives every supernode of the launch through one
state file, and refuses UB between supernodes."""

from __future__ import annotations

import json
from pathlib import Path

from cmemu.emulator.testing import cmemu_up, free_port_block, launch_ports, run_cmemu

PRESET = "cm-minix2"


def test_up_status_and_xfer_reach_every_supernode(tmp_path: Path) -> None:
    state_file = tmp_path / "s.json"
    base = free_port_block(launch_ports(PRESET))
    output: list[str] = []
    args = ("--preset", PRESET, "--base-port", str(base), "--ui", "none", "--broker", "none")
    with cmemu_up(state_file, *args, output=output, quiet=True):
        s = ("--state-file", str(state_file))
        status = run_cmemu("status", *s, "--json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["supernodes"] == ["sn0", "sn1"]
        assert report["devices"] == report["devices_serving"] == 2 * 26
        assert {"sn0-gw", "sn1-gw", "sn1-fabric", "fabric"} <= set(report["services"])
        listed_gw = json.loads(run_cmemu("ls", "--kind", "gateway", "--json", *s).stdout)
        assert [(r["id"], r["health"]) for r in listed_gw] == [
            ("sn0-gw", "SERVING"),
            ("sn1-gw", "SERVING"),
        ]
        inside = run_cmemu("xfer", "sn1-n00-npu0", "sn1-n01-mem", "--bytes", "1MB", "--json", *s)
        assert inside.returncode == 0, inside.stderr
        assert json.loads(inside.stdout)["bytes"] == 10**6
        across = run_cmemu("xfer", "n00-npu0", "sn1-n00-npu0", "--bytes", "1MB", *s)
        assert across.returncode != 0
        assert "UB never crosses supernodes" in across.stderr and "Traceback" not in across.stderr
        unknown = run_cmemu("xfer", "sn3-n00-npu0", "n00-npu0", "--bytes", "1MB", *s)
        assert unknown.returncode != 0 and "sn3" in unknown.stderr
        fault = run_cmemu("fault", "add", "crash", "sn1-n01-npu2", "--for", "600", *s)
        assert fault.returncode == 0, fault.stderr
        listed = run_cmemu("fault", "ls", *s)
        assert "sn1-n01-npu2" in listed.stdout, listed.stderr
        cleared = run_cmemu("fault", "rm", "dev:sn1-n01-npu2:crash", *s)
        assert cleared.returncode == 0, cleared.stderr
        assert "no active faults" in run_cmemu("fault", "ls", *s).stdout


def test_topology_prints_every_supernode_and_presets_list_them() -> None:
    text = run_cmemu("topology", "--preset", PRESET)
    assert text.returncode == 0, text.stderr
    assert "supernode sn0" in text.stdout and "supernode sn1" in text.stdout
    assert "gateways sn0-gw, sn1-gw" in text.stdout
    docs = json.loads(run_cmemu("topology", "--preset", PRESET, "--json").stdout)
    assert [d["supernode"] for d in docs] == ["sn0", "sn1"]
    assert docs[0]["scaleout"] == docs[1]["scaleout"]
    presets = run_cmemu("presets").stdout
    assert "cm384x2" in presets and "2 x 48 nodes" in presets
    bad = run_cmemu("topology", "--preset", "cm384x0")
    assert bad.returncode == 2 and "cm384x<N>" in bad.stderr
