"""Kubernetes manifests: valid against the API schema (offline), the same as the golden files,
one Service per device naming the pod that serves it, the registry's waves and memory, the
secrets kept across a regeneration; and the local runner's reading of them, bad inputs too."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import os
import stat
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.topology import DNS_LABEL, ServiceKind, Topology
from cmemu.emulator.runtime import composegen, k8sgen, k8srun
from cmemu.emulator.runtime.launchmodes import K8s
from cmemu.emulator.runtime.registry import DEVICE_WAVE, SERVICE_SPECS
from cmemu.emulator.runtime.serve import read_document
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.v1 import device_pb2

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GOLDEN_PRESETS = ["cm-mini", "cm-minix2"]
VERSIONS = [k8sgen.API_MIN_VERSION, kubernetes_validate.utils.latest_version()]


def _objects(files: dict[str, str]) -> list[dict[str, Any]]:
    return [obj for text in files.values() for obj in k8sgen.objects_of(text)]


def _of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _validate_all(objects: list[dict[str, Any]], versions: list[str]) -> None:
    for obj in objects:
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(map(str, exc.path))
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} ({version}): {path}: {exc}")


def _shape(value: Any) -> Any:
    """What the API schema checks of an object: its fields and their types, not their values
    (names, ports and addresses differ between cm384's 630 Services, their shape does not)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _shape(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(sorted({repr(_shape(v)) for v in value})))
    return type(value).__name__


def _one_of_each_shape(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({repr(_shape(o)): o for o in objects}.values())


def _topology_of(config_map: dict[str, Any]) -> Topology:
    packed = base64.b64decode(config_map["binaryData"][k8sgen.TOPOLOGY_KEY])
    return Topology.from_json(gzip.decompress(packed).decode())


@pytest.mark.parametrize(("preset", "per"), [("cm-mini", "node"), ("cm-mini", "device")])
def test_every_object_validates_against_the_api_schema(preset: str, per: str) -> None:
    files = k8sgen.generate(preset, per)  # type: ignore[arg-type]
    objects = _objects(files) + k8sgen.secret_objects(k8sgen.DEFAULT_NAMESPACE, "t0ken")
    _validate_all(objects, VERSIONS)
    kinds = {o["kind"] for o in objects}
    assert kinds == {"Namespace", "Secret", "ConfigMap", "Deployment", "Service"}


def test_several_supernodes_validate_and_share_one_namespace() -> None:
    files = k8sgen.generate("cm-minix2", "node")
    _validate_all(_objects(files), VERSIONS)
    assert sorted(files) == [
        k8sgen.NAMESPACE_FILE,
        k8sgen.BROKER_FILE,
        "10-sn0.yaml",
        "10-sn1.yaml",
    ]
    objects = _objects(files)
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        k8sgen.DEFAULT_NAMESPACE
    }
    maps = _of_kind(objects, "ConfigMap")
    first, second = _topology_of(maps["topology-sn0"]), _topology_of(maps["topology-sn1"])
    assert (first.supernode, second.supernode) == ("sn0", "sn1")
    deployments = _of_kind(objects, "Deployment")
    # sn1's fabric takes sn0's clock: it waits for sn0's fabric
    wait = deployments["sn1-fabric"]["spec"]["template"]["spec"]["initContainers"][0]
    assert wait["args"] == [first.service(ServiceKind.FABRIC).address]
    for topology in (first, second):  # every supernode-wide service, the gateways among them
        for service in topology.services:
            assert service.id in deployments


@pytest.mark.slow
def test_cm384_fits_and_validates() -> None:
    files = k8sgen.generate("cm384", "node")
    objects = _objects(files)
    shapes = _one_of_each_shape(
        objects
    )  # 687 objects, a handful of shapes (validating all took 14 s of CPU)
    assert len(shapes) < 20 and {o["kind"] for o in shapes} == {o["kind"] for o in objects}
    _validate_all(shapes, VERSIONS[-1:])
    config_map = _of_kind(objects, "ConfigMap")["topology-sn0"]
    data = config_map["binaryData"][k8sgen.TOPOLOGY_KEY]
    assert len(data) < k8sgen.MAX_OBJECT_BYTES  # gzipped: 1.2 MB of JSON would not fit
    assert len(_topology_of(config_map).devices) == 624
    assert len(_of_kind(objects, "Deployment")) == 48 + len(_topology_of(config_map).services) + 1


def _normal(text: str) -> list[Any]:
    """A manifest file as data, its gzipped documents unpacked (gzip's bytes may differ
    between zlib builds; the document may not)."""
    head = text.splitlines()[0]
    objects = k8sgen.objects_of(text)
    for obj in objects:
        for key, value in (obj.get("binaryData") or {}).items():
            obj["binaryData"][key] = json.loads(gzip.decompress(base64.b64decode(value)))
    return [head, *objects]


@pytest.mark.parametrize("preset", GOLDEN_PRESETS)
def test_manifests_match_the_golden_files(preset: str) -> None:
    """What `cmemu k8s --preset P` writes; a change to the topology, the registry or the
    generator shows up here. Regenerate with CMEMU_UPDATE_GOLDEN=1 after checking the diff."""
    files = k8sgen.generate(preset, "node")
    directory = GOLDEN / f"{preset}.k8s"
    if os.environ.get("CMEMU_UPDATE_GOLDEN"):
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("*.yaml"):
            old.unlink()
        for name, text in files.items():
            (directory / name).write_text(text)
    assert sorted(p.name for p in directory.glob("*.yaml")) == sorted(files)
    for name, text in files.items():
        assert _normal(text) == _normal((directory / name).read_text()), f"{preset}: {name}"


@pytest.mark.parametrize("per", ["node", "device"])
def test_every_device_resolves_to_the_pod_serving_it_on_its_port(per: str) -> None:
    files = k8sgen.generate("cm-mini", per)  # type: ignore[arg-type]
    objects = _objects(files)
    (topology,) = composegen.compose_topologies("cm-mini", per)
    services, deployments = _of_kind(objects, "Service"), _of_kind(objects, "Deployment")
    for device in topology.devices:
        service = services[device.id]
        assert DNS_LABEL.match(device.id)
        assert service["spec"]["clusterIP"] == "None"  # headless: the name is the pod's IP
        pod_name = service["spec"]["selector"][k8sgen.POD_LABEL]
        assert pod_name == (device.node if per == "node" else device.id)
        port = int(device.address.rpartition(":")[2])
        assert service["spec"]["ports"][0]["port"] == port
        pod = deployments[pod_name]["spec"]["template"]["spec"]
        hosts = {
            s for s, x in services.items() if x["spec"]["selector"] == {"cmemu.io/pod": pod_name}
        }
        container = pod["containers"][0]
        assert port in [p["containerPort"] for p in container["ports"]]
        # it binds the name on every interface before any Service lists it
        assert pod["hostAliases"] == [
            {"ip": "0.0.0.0", "hostnames": [d.id for d in topology.devices if d.id in hosts]}
        ]
        assert "hostname" not in pod  # the kubelet would map it to the pod's IP alone
        assert container["command"][-2:] == [f"--{per}", pod_name]
        assert container["readinessProbe"]["grpc"]["port"] in (50051, port)


def test_services_follow_the_registry() -> None:
    """Waves, memory and init waits come from SERVICE_SPECS for every service there is."""
    objects = _objects(k8sgen.generate("cm-mini", "node"))
    (topology,) = composegen.compose_topologies("cm-mini", "node")
    deployments = _of_kind(objects, "Deployment")
    pools = [d.address for d in topology.devices if d.id.endswith("-mem")]
    for service in topology.services:
        spec = SERVICE_SPECS[service.kind]
        deployment = deployments[service.id]
        template = deployment["spec"]["template"]
        assert template["metadata"]["annotations"][k8sgen.WAVE_ANNOTATION] == str(spec.wave)
        assert template["metadata"]["annotations"]["prometheus.io/port"] == "9464"
        assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        container = template["spec"]["containers"][0]
        limit = container["resources"]["limits"]["memory"]
        assert limit == spec.mem_limit[:-1] + {"m": "Mi", "g": "Gi"}[spec.mem_limit[-1]]
        assert container["livenessProbe"]["grpc"] == {"port": 50051}
        waits = [a for c in template["spec"].get("initContainers", []) for a in c["args"]]
        earlier = [x.address for x in topology.services if SERVICE_SPECS[x.kind].wave < spec.wave]
        assert waits == earlier + (pools if spec.after_pools else [])
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert (composegen.EMS_SSD_IN_CONTAINER in mounts) == spec.keeps_files
    node = deployments["n00"]["spec"]["template"]
    assert node["metadata"]["annotations"][k8sgen.WAVE_ANNOTATION] == str(DEVICE_WAVE)
    assert node["spec"]["initContainers"][0]["args"] == [
        topology.service(ServiceKind.FABRIC).address
    ]


def test_the_config_map_holds_the_compose_document_gzipped(tmp_path: Path) -> None:
    objects = _objects(k8sgen.generate("cm-mini", "node"))
    (expected,) = composegen.compose_topologies("cm-mini", "node")
    config_map = _of_kind(objects, "ConfigMap")["topology-sn0"]
    assert _topology_of(config_map) == expected
    path = tmp_path / k8sgen.TOPOLOGY_KEY
    path.write_bytes(base64.b64decode(config_map["binaryData"][k8sgen.TOPOLOGY_KEY]))
    assert Topology.from_json(read_document(path)) == expected  # what `cmemu serve` reads
    path.write_bytes(b"\x1f\x8bnot gzip")
    with pytest.raises(InvalidArgumentError, match="broken gzip"):
        read_document(path)


def test_a_document_over_the_object_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8sgen, "MAX_OBJECT_BYTES", 1000)
    with pytest.raises(InvalidArgumentError, match="over the 1000 a ConfigMap holds"):
        k8sgen.generate("cm-mini", "node")


def test_write_keeps_the_token_and_replaces_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    written = k8sgen.write("cm-minix2", "node", out)
    secrets = out / k8sgen.SECRETS_FILE
    assert secrets in written and stat.S_IMODE(secrets.stat().st_mode) == 0o600
    first = k8sgen.objects_of(secrets.read_text())
    _validate_all(first, VERSIONS)
    token = first[0]["stringData"][composegen.TOKEN_SECRET]
    k8sgen.write("cm-mini", "node", out, namespace="elsewhere")  # one supernode now
    assert not (out / "10-sn1.yaml").exists()  # no stale object left to apply
    again = k8sgen.objects_of(secrets.read_text())
    assert again[0]["stringData"][composegen.TOKEN_SECRET] == token
    assert {o["metadata"]["namespace"] for o in again} == {"elsewhere"}


def test_write_refuses_what_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(InvalidArgumentError, match=r"did not write \(notes\.txt\)"):
        k8sgen.write("cm-mini", "node", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        k8sgen.write("cm-mini", "node", tmp_path / "notes.txt")
    with pytest.raises(InvalidArgumentError, match="cannot write the manifests"):
        k8sgen.write("cm-mini", "node", tmp_path / "notes.txt" / "below")


# --- the local runner ---------------------------------------------------------------------------


def test_the_local_runner_starts_pods_in_the_registrys_waves(tmp_path: Path) -> None:
    k8sgen.write("cm-mini", "node", tmp_path / "k8s")
    run = k8srun.load(tmp_path / "k8s", tmp_path / "run")
    waves = [[s.name for s in wave] for wave in run.waves]
    assert waves[0] == ["mosquitto", "fabric"]
    assert waves[1] == ["n00", "n01"]
    expected = sorted({spec.wave for spec in SERVICE_SPECS.values()} | {DEVICE_WAVE})
    assert len(waves) == len(expected)
    (topology,) = run.supernodes
    assert topology.device("n01-npu1").address.startswith("127.70.")
    assert topology.device("n01-npu1").address.endswith(":50052")  # the node's IP, its slot
    n01 = next(s for s in run.waves[1] if s.name == "n01")
    assert n01.servers == tuple(d.id for d in topology.in_node("n01"))
    assert n01.addresses == (topology.device("n01-npu0").address,)  # its readiness probe
    assert run.token and topology.broker and topology.broker.startswith("mqtt://127.70.")
    local = Path(n01.argv[n01.argv.index("--topology") + 1])
    served = Topology.from_json(read_document(local))  # rewritten, still gzipped
    assert served == dataclasses.replace(topology, broker=None)  # the broker: $CMEMU_BROKER
    assert local.read_bytes()[:2] == b"\x1f\x8b"


@pytest.mark.parametrize("broker", ["none", "mqtt://127.0.0.1:1999"])
def test_a_broker_of_the_launchers_replaces_the_manifests(tmp_path: Path, broker: str) -> None:
    k8sgen.write("cm-mini", "device", tmp_path / "k8s")
    run = k8srun.load(tmp_path / "k8s", tmp_path / "run", broker=broker)
    specs = [s for wave in run.waves for s in wave]
    assert "mosquitto" not in {s.name for s in specs}
    assert {s.env.get("CMEMU_BROKER") for s in specs} == {None if broker == "none" else broker}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (None, "no manifest"),
        (("kind: Deployment", "kind: StatefulSet"), "runs Deployments"),
        (("cmemu.io/wave: '0'", "cmemu.io/wave: soon"), "not a number"),
        (("  name: topology-sn0\n  namespace", "  name: other\n  namespace"), "no ConfigMap 'top"),
        (("value: cmemu\n", "valueFrom: {}\n"), "no plain value"),
        (("apiVersion: v1\nkind: ConfigMap", "- [1"), "cannot read manifest"),
    ],
)
def test_bad_manifests_are_refused(
    tmp_path: Path, change: tuple[str, str] | None, words: str
) -> None:
    out = tmp_path / "k8s"
    k8sgen.write("cm-mini", "node", out)
    if change is None:
        for path in out.iterdir():
            path.unlink()
    else:
        _edit(out / "10-sn0.yaml", *change)
    with pytest.raises(InvalidArgumentError, match=words):
        k8srun.load(out, tmp_path / "run")


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not a directory of manifests"):
        k8srun.load(tmp_path / "nowhere", tmp_path / "run")


def test_launch_options_pair_the_mode_with_its_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="manifests must be a Path"):
        K8s(manifests=None)  # type: ignore[arg-type]
    options = LaunchOptions(preset="any: the manifests say", mode=K8s(manifests=tmp_path))
    assert isinstance(options.mode, K8s) and options.mode.manifests == tmp_path
    assert options.run_dir is None  # a temporary directory when it starts
    with pytest.raises(InvalidArgumentError, match="its files give the addresses"):
        options.topology()


@pytest.mark.slow
@pytest.mark.xdist_group("loopback-k8s")  # 127.70.x.y, k8srun's: see tests/conftest.py
async def test_the_typed_api_runs_the_manifests(tmp_path: Path) -> None:
    """Without their broker (none), as a program would start them: typed clients reach every
    device through the addresses the runner gave the pods."""
    k8sgen.write("cm-mini", "node", tmp_path / "k8s")
    options = LaunchOptions(
        mode=K8s(manifests=tmp_path / "k8s", run_dir=tmp_path / "run"), broker="none"
    )
    async with Supernode.start(options) as sn:
        assert sn.mode == f"k8s {tmp_path / 'k8s'}"
        assert sn.topology.broker is None
        info = await sn.clients.device("n01-mem").GetInfo(device_pb2.GetInfoRequest())
        assert info.id == "n01-mem"
        assert sn.supervisor is not None
        assert {"fabric", "n00", "n01"} <= set(sn.supervisor.running)
    assert not (tmp_path / "run").exists()  # nothing died: nothing kept
