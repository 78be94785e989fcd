"""`cmemu k8s` and `cmemu up --from-k8s` as a user runs them: the manifests' own containers as
real processes on loopback addresses, called through the real grpcurl; bad inputs refused with a
message and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cmemu.emulator.runtime import k8sgen, state
from cmemu.emulator.testing import MINI_SERVERS, cmemu_up, run_cmemu

GRPCURL = str(Path(sys.executable).parent / "grpcurl")
BIN = str(Path(sys.executable).parent)


def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GRPCURL, "-plaintext", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr


# --- bad inputs ---------------------------------------------------------------------------------


def test_an_unknown_preset_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cmemu("k8s", "--preset", "cm999", "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and "unknown preset" in result.stderr
    _no_traceback(result)
    assert not (tmp_path / "out").exists()


def test_an_unwritable_or_foreign_directory_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x\n")
    result = run_cmemu("k8s", "--preset", "cm-mini", "-o", str(blocker / "below"))
    assert result.returncode == 1 and "cannot write the manifests" in result.stderr
    _no_traceback(result)
    result = run_cmemu("k8s", "--preset", "cm-mini", "-o", str(tmp_path))
    assert result.returncode == 1 and "did not write (a-file)" in result.stderr
    _no_traceback(result)
    result = run_cmemu("k8s", "--preset", "cm-mini", "-o", str(tmp_path / "k"), "--namespace", "A_")
    assert result.returncode == 2 and "not a DNS label" in result.stderr


def test_generate_then_regenerate_into_the_same_directory(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    first = run_cmemu("k8s", "--preset", "cm-mini", "-o", str(out))
    assert first.returncode == 0, first.stderr
    assert f"kubectl apply -f {out}" in first.stdout
    token = (out / k8sgen.SECRETS_FILE).read_text()
    again = run_cmemu("k8s", "--preset", "cm-mini", "--per", "device", "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert "--per device" in (out / "10-sn0.yaml").read_text().splitlines()[0]
    kept = [o["stringData"] for o in k8sgen.objects_of((out / k8sgen.SECRETS_FILE).read_text())]
    assert kept[0] == k8sgen.objects_of(token)[0]["stringData"]  # the running token stays


def test_up_from_a_missing_directory_says_so(tmp_path: Path) -> None:
    result = run_cmemu(
        "up", "--from-k8s", str(tmp_path / "nowhere"), "--state-file", str(tmp_path / "s.json")
    )
    assert result.returncode == 1 and "not a directory of manifests" in result.stderr
    _no_traceback(result)
    assert not list(tmp_path.iterdir())  # no run directory left behind
    both = run_cmemu("up", "--from-k8s", str(tmp_path), "--from-compose", "x.yaml")
    assert both.returncode == 2 and "one of them" in both.stderr


# --- end to end -------------------------------------------------------------------------------


def _deployment(out: Path, name: str) -> dict[str, Any]:
    for path in sorted(out.glob("*.yaml")):
        for obj in k8sgen.objects_of(path.read_text()):
            if obj["kind"] == "Deployment" and obj["metadata"]["name"] == name:
                return obj
    raise AssertionError(f"no Deployment {name}")


def _wait_script(
    out: Path, name: str, addresses: dict[str, str], *extra: str
) -> subprocess.Popen[str]:
    """A pod's init container, its DNS names made the running addresses."""
    init = _deployment(out, name)["spec"]["template"]["spec"]["initContainers"][0]
    args = [addresses[a.rpartition(":")[0]] for a in init["args"]]
    return subprocess.Popen(
        [*init["command"], *args, *extra],
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
        text=True,
    )


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-k8s")  # 127.70.x.y, k8srun's: see tests/conftest.py
def test_cm_mini_from_its_manifests(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    assert run_cmemu("k8s", "--preset", "cm-mini", "-o", str(out)).returncode == 0
    state_file = tmp_path / "state.json"
    output: list[str] = []
    with cmemu_up(
        state_file,
        "--from-k8s",
        str(out),
        "--ui",
        "none",
        output=output,
        env={"TMPDIR": str(tmp_path)},
    ):
        doc = json.loads(state_file.read_text())
        rows = json.loads(run_cmemu("ls", "--state-file", str(state_file), "--json").stdout)
        assert len(rows) == MINI_SERVERS and {r["health"] for r in rows} == {"SERVING"}
        assert all(r["address"].startswith("127.70.") for r in rows)
        # a per-node pod serves its second device on the next port, as its Service says
        npu = next(d for d in doc["devices"] if d["id"] == "n01-npu1")
        assert npu["address"].endswith(":50052")
        info = _grpcurl(npu["address"], "cmemu.v1.Device/GetInfo")
        assert info.returncode == 0, info.stderr
        assert json.loads(info.stdout)["id"] == "n01-npu1"
        fabric = next(x for x in doc["services"] if x["id"] == "fabric")
        health = _grpcurl(fabric["address"], "grpc.health.v1.Health/Check")
        assert json.loads(health.stdout) == {"status": "SERVING"}
        xfer = run_cmemu(
            "xfer",
            "n00-npu0",
            "n01-mem",
            "--bytes",
            "4096",
            "--state-file",
            str(state_file),
            "--json",
        )
        assert xfer.returncode == 0, xfer.stderr
        assert json.loads(xfer.stdout)["planes"] == 7  # through the fabric's own process
        # what Kubernetes runs before EMS: it returns once the fabric and the pools serve...
        addresses = {d["id"]: d["address"] for d in doc["devices"]}
        addresses |= {x["id"]: x["address"] for x in doc["services"]}
        waiting = _wait_script(out, "ems", addresses)
        assert waiting.wait(timeout=60) == 0
        # ...and keeps waiting while one of them does not
        stuck = _wait_script(out, "ems", addresses, "127.70.250.250:50051")
        with pytest.raises(subprocess.TimeoutExpired):
            stuck.wait(timeout=3)
        stuck.kill()
        stuck.wait()
    assert "cmemu: stopped" in output[0]


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-k8s")  # 127.70.x.y, k8srun's: see tests/conftest.py
def test_two_supernodes_from_their_manifests(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    assert run_cmemu("k8s", "--preset", "cm-minix2", "-o", str(out)).returncode == 0
    state_file = tmp_path / "state.json"
    with cmemu_up(
        state_file,
        "--from-k8s",
        str(out),
        "--ui",
        "none",
        timeout_s=240,
        env={"TMPDIR": str(tmp_path)},
    ):
        doc = json.loads(state_file.read_text())
        gateways = {g["id"]: g["address"] for g in doc["scaleout"]["gateways"]}
        assert sorted(gateways) == ["sn0-gw", "sn1-gw"]
        for address in gateways.values():  # every gateway serves, reached as a user would
            assert address.startswith("127.70.")
            health = _grpcurl(address, "grpc.health.v1.Health/Check")
            assert json.loads(health.stdout) == {"status": "SERVING"}, health.stderr
        body = json.dumps({"src": "n00-npu0", "dst": "sn1-n01-npu2"})
        route = _grpcurl("-d", body, gateways["sn0-gw"], "cmemu.v1.Gateway/Route")
        assert route.returncode == 0, route.stderr
        path = json.loads(route.stdout)["path"]
        assert path[0] == "n00-npu0.d0" and path[-1] == "sn1-n01-npu2.d0"
        sn1 = state.read_supernodes(state_file)[1].device("sn1-n01-npu1")
        assert sn1.address.startswith("127.70.")
        info = _grpcurl(sn1.address, "cmemu.v1.Device/GetInfo")
        assert json.loads(info.stdout)["id"] == "sn1-n01-npu1"
