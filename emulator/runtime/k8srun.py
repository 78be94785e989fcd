"""Running Kubernetes manifests as local processes (`cmemu up --from-k8s DIR`), without a cluster.

It reads manifests of the shape emulator/runtime/k8sgen.py writes, as compose files are run by
emulator/runtime/composerun.py (whose helpers it shares): every pod gets a loopback address, and
the names that reach it (its Deployment's name, its hostname, its hostAliases, each Service
selecting it) become that address; its ConfigMaps and Secrets become local files where its
container mounts them (the topology documents rewritten to the loopback addresses); and it runs
exactly its container's command with its environment. Pods start wave by wave (the
`cmemu.io/wave` annotation), each wave once the previous one's readiness probes answer SERVING:
the order the init containers and readiness probes give on a cluster.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cmemu.emulator.model.addressplans import K8S_FIRST_OCTET, loopback_ip
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime.composerun import BROKER_IMAGES, IMAGES, Rehost, private_path
from cmemu.emulator.runtime.k8sgen import WAVE_ANNOTATION
from cmemu.emulator.runtime.launchoptions import CMEMU
from cmemu.emulator.runtime.procs import ProcSpec
from cmemu.emulator.runtime.security import TOKEN_ENV, read_token, write_secret
from cmemu.emulator.runtime.serve import BROKER_ENV, GZIP_MAGIC

MANIFEST_SUFFIXES = (".yaml", ".yml")
PASSIVE_KINDS = frozenset({"Namespace", "ConfigMap", "Secret", "Service"})  # nothing to run
TOPOLOGY_SUFFIXES = (".json", ".json.gz")  # a ConfigMap key holding a topology document


@dataclass(frozen=True, kw_only=True)
class K8sRun:
    """What the manifests run: process waves, the supernodes' documents, the token."""

    waves: list[list[ProcSpec]]
    supernodes: tuple[Topology, ...]
    token: str | None


@dataclass(frozen=True, kw_only=True)
class _Pod:
    name: str
    labels: dict[str, str]
    spec: dict[str, Any]
    wave: int

    @property
    def container(self) -> dict[str, Any]:
        containers = self.spec.get("containers") or []
        if not containers:
            raise InvalidArgumentError(f"workload {self.name} has no container")
        first: dict[str, Any] = containers[0]
        return first

    @property
    def image(self) -> str:
        return str(self.container.get("image", "")).split(":")[0]


def read_objects(directory: Path) -> list[dict[str, Any]]:
    """Every object of the manifest files in `directory`, in file order (kubectl's)."""
    if not directory.is_dir():
        raise InvalidArgumentError(f"{directory} is not a directory of manifests")
    files = sorted(p for p in directory.iterdir() if p.suffix in MANIFEST_SUFFIXES)
    if not files:
        raise InvalidArgumentError(f"{directory} holds no manifest (*.yaml)")
    objects = []
    for path in files:
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise InvalidArgumentError(f"cannot read manifest {path}: {exc}") from exc
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict) or not doc.get("kind") or not _name(doc):
                raise InvalidArgumentError(f"{path}: an object without kind or metadata.name")
            objects.append(doc)
    return objects


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _pods(objects: list[dict[str, Any]]) -> list[_Pod]:
    pods = []
    for obj in objects:
        kind, name = obj["kind"], _name(obj)
        if kind in PASSIVE_KINDS:
            continue
        if kind != "Deployment":
            raise InvalidArgumentError(
                f"{kind} {name}: the local runner runs Deployments (and reads "
                f"{', '.join(sorted(PASSIVE_KINDS))})"
            )
        template = (obj.get("spec") or {}).get("template") or {}
        meta = template.get("metadata") or {}
        wave = (meta.get("annotations") or {}).get(WAVE_ANNOTATION)
        try:
            number = int(str(wave))
        except ValueError:
            raise InvalidArgumentError(
                f"Deployment {name}: annotation {WAVE_ANNOTATION} (its start wave) is "
                f"{wave!r}, not a number"
            ) from None
        pods.append(
            _Pod(
                name=name,
                labels=dict(meta.get("labels") or {}),
                spec=template.get("spec") or {},
                wave=number,
            )
        )
    if not pods:
        raise InvalidArgumentError("the manifests have no Deployment: nothing to run")
    return pods


def _selects(service: dict[str, Any], pod: _Pod) -> bool:
    selector = (service.get("spec") or {}).get("selector") or {}
    return bool(selector) and all(pod.labels.get(k) == v for k, v in selector.items())


def _names(pod: _Pod, services: list[dict[str, Any]]) -> list[str]:
    """The names that reach a pod: its workload's, its hostname, its host aliases, and every
    Service that selects it."""
    names = [pod.name, str(pod.spec.get("hostname") or pod.name)]
    for alias in pod.spec.get("hostAliases") or []:
        names += [str(h) for h in alias.get("hostnames") or []]
    names += [_name(s) for s in services if _selects(s, pod)]
    return list(dict.fromkeys(names))


class _Volumes:
    """Local copies of the ConfigMaps and Secrets the pods mount (each written once), the
    topology documents among them rewritten to the loopback addresses."""

    def __init__(self, objects: list[dict[str, Any]], run_dir: Path, rehost: Rehost) -> None:
        self.by_kind = {
            (o["kind"], _name(o)): o for o in objects if o["kind"] in ("ConfigMap", "Secret")
        }
        self.run_dir = run_dir
        self.rehost = rehost
        self.written: dict[tuple[str, str], Path] = {}
        self.topologies: dict[str, Topology] = {}

    def local(self, pod: _Pod, volume: dict[str, Any]) -> Path:
        """The local directory holding a volume's files."""
        if "configMap" in volume:
            return self._source("ConfigMap", str(volume["configMap"].get("name", "")))
        if "secret" in volume:
            return self._source("Secret", str(volume["secret"].get("secretName", "")))
        if "emptyDir" in volume:
            path = self.run_dir / "fs" / pod.name / str(volume.get("name"))
            path.mkdir(parents=True, exist_ok=True)
            return path
        raise InvalidArgumentError(
            f"pod {pod.name}: volume {volume.get('name')!r} is neither a ConfigMap, a Secret "
            "nor an emptyDir"
        )

    def _source(self, kind: str, name: str) -> Path:
        if (kind, name) in self.written:
            return self.written[(kind, name)]
        obj = self.by_kind.get((kind, name))
        if obj is None:
            raise InvalidArgumentError(f"no {kind} {name!r} in the manifests")
        target = self.run_dir / kind.lower() / name
        target.mkdir(parents=True, exist_ok=True)
        for key, raw in _entries(obj).items():
            data = (
                self._topology(f"{kind} {name} key {key}", raw)
                if key.endswith(TOPOLOGY_SUFFIXES)
                else raw
            )
            if kind == "Secret":
                write_secret(target / key, data.decode())
            else:
                (target / key).write_bytes(data)
        self.written[(kind, name)] = target
        return target

    def _topology(self, where: str, data: bytes) -> bytes:
        packed = data[:2] == GZIP_MAGIC
        try:
            text = (gzip.decompress(data) if packed else data).decode()
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"{where}: not a topology document: {exc}") from exc
        topology = Topology.from_json(self.rehost(Topology.from_json(text).to_json()))
        self.topologies[topology.supernode] = topology
        out = topology.to_json().encode()
        return gzip.compress(out, mtime=0) if packed else out


def _entries(obj: dict[str, Any]) -> dict[str, bytes]:
    """A ConfigMap's or a Secret's keys and their bytes (data, binaryData, stringData)."""
    out: dict[str, bytes] = {}
    try:
        if obj["kind"] == "Secret":
            out |= {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        else:
            out |= {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
        out |= {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        out |= {k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()}
    except ValueError as exc:
        raise InvalidArgumentError(f"{obj['kind']} {_name(obj)}: bad base64: {exc}") from exc
    return out


def _mounts(pod: _Pod, volumes: _Volumes) -> dict[str, str]:
    """The container's mount paths and the local paths that stand for them."""
    by_name = {str(v.get("name")): v for v in pod.spec.get("volumes") or []}
    mounts = {}
    for mount in pod.container.get("volumeMounts") or []:
        volume = by_name.get(str(mount.get("name")))
        if volume is None:
            raise InvalidArgumentError(f"pod {pod.name} mounts unknown volume {mount.get('name')}")
        local = volumes.local(pod, volume)
        if mount.get("subPath"):
            local = local / str(mount["subPath"])
        mounts[str(mount["mountPath"]).rstrip("/")] = str(local)
    return mounts


def _mapped(path: str, mounts: dict[str, str]) -> str | None:
    """A container path's local stand-in, through the deepest mount holding it."""
    for mount in sorted(mounts, key=len, reverse=True):
        if path == mount or path.startswith(mount + "/"):
            return mounts[mount] + path[len(mount) :]
    return None


def _spec(pod: _Pod, ip: str, volumes: _Volumes, ids: set[str], names: list[str]) -> ProcSpec:
    container, rehost = pod.container, volumes.rehost
    mounts = _mounts(pod, volumes)
    env = {}
    for var in container.get("env") or []:
        if "value" not in var:
            raise InvalidArgumentError(
                f"pod {pod.name}: ${var.get('name')} has no plain value (valueFrom is not run)"
            )
        value = str(var["value"])
        env[str(var["name"])] = _mapped(value, mounts) or rehost(value)
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if command:
        argv = [
            _mapped(a, mounts) or private_path(a, pod.name, volumes.run_dir) or rehost(a)
            for a in map(str, command)
        ]
        if argv[0] == "cmemu":
            argv[0] = CMEMU  # the fork server forks what runs this program
    elif pod.image in IMAGES:
        argv = IMAGES[pod.image](ip, volumes.run_dir, mounts)
    else:
        raise InvalidArgumentError(f"pod {pod.name}: no command, and image {pod.image!r} unknown")
    port = ((container.get("readinessProbe") or {}).get("grpc") or {}).get("port")
    return ProcSpec(
        name=pod.name,
        argv=tuple(argv),
        env=env,
        addresses=(f"{ip}:{port}",) if port else (),
        servers=tuple(n for n in names if n in ids),
    )


def _with_broker(spec: ProcSpec, broker: str) -> ProcSpec:
    """Its $CMEMU_BROKER made `broker` (none: unset)."""
    env = {k: v for k, v in spec.env.items() if k != BROKER_ENV}
    if broker != "none":
        env[BROKER_ENV] = broker
    return dataclasses.replace(spec, env=env)


def load(directory: Path, run_dir: Path, *, broker: str | None = None) -> K8sRun:
    """The pods of the manifests in `directory` as process waves, and the topology documents
    they serve. `broker` (a URL, or "none") takes the place of the manifests' own broker."""
    objects = read_objects(directory)
    pods = _pods(objects)
    services = [o for o in objects if o["kind"] == "Service"]
    if broker is not None:
        dropped = [p for p in pods if p.image in BROKER_IMAGES]
        pods = [p for p in pods if p not in dropped]
        services = [s for s in services if not any(_selects(s, p) for p in dropped)]
    names = {pod.name: _names(pod, services) for pod in pods}
    ips = {pod.name: loopback_ip(i, K8S_FIRST_OCTET) for i, pod in enumerate(pods)}
    rehost = Rehost({n: ips[pod] for pod, ns in names.items() for n in ns})
    volumes = _Volumes(objects, run_dir, rehost)
    for pod in pods:  # the documents first: the servers a pod hosts are their ids
        _mounts(pod, volumes)
    if not volumes.topologies:
        raise InvalidArgumentError("no pod mounts a ConfigMap holding a topology document")
    supernodes = tuple(sorted(volumes.topologies.values(), key=lambda t: t.index))
    ids = {d.id for t in supernodes for d in t.devices} | {
        x.id for t in supernodes for x in t.services
    }
    specs = {pod.name: _spec(pod, ips[pod.name], volumes, ids, names[pod.name]) for pod in pods}
    if broker is not None:
        specs = {name: _with_broker(spec, broker) for name, spec in specs.items()}
    brokers = sorted({s.env[BROKER_ENV] for s in specs.values() if BROKER_ENV in s.env})
    if brokers:  # where `cmemu watch` finds the events, through the state file
        supernodes = tuple(dataclasses.replace(t, broker=brokers[0]) for t in supernodes)
    tokens = sorted({s.env[TOKEN_ENV] for s in specs.values() if s.env.get(TOKEN_ENV)})
    waves = [
        [specs[p.name] for p in pods if p.wave == wave] for wave in sorted({p.wave for p in pods})
    ]
    return K8sRun(
        waves=waves,
        supernodes=supernodes,
        token=read_token(Path(tokens[0])) if tokens else None,
    )
