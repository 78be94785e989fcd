"""The state file: how client commands find a running emulator, one file per named instance.

`cmemu up` writes the topology document with live addresses, plus a `launcher` record (who wrote
it, when, how), once every device is SERVING, and removes it when it stops. Every client command
reads it. Where it lives, in order:
- `--state-file PATH`;
- `<dir>/<name>.json` for an explicit `--name NAME`;
- `$CMEMU_STATE_FILE` (kept for compatibility);
- `<dir>/default.json`;
with `<dir>` = `$CMEMU_STATE_DIR`, else `$XDG_STATE_HOME/cmemu`, else `~/.local/state/cmemu`.
Instance names are DNS labels, like device ids.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.credentials import Credentials
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError, PreconditionError
from cmemu.emulator.model.topology import DNS_LABEL, Link, Topology, records
from cmemu.emulator.runtime.security import mqtt_password, read_token, write_secret

if TYPE_CHECKING:  # the fault kinds are imported where they are used (fault_clients): every
    # `cmemu` command reads a state file, few inject faults, and the kinds' registry costs a
    # command about 0.1 CPU s of imports (a third of `cmemu status`'s)
    from cmemu.emulator.client.faultkinds.process import ProcessTable
    from cmemu.emulator.runtime.docker import DockerEngine

ENV_VAR = "CMEMU_STATE_FILE"
DIR_ENV_VAR = "CMEMU_STATE_DIR"
DEFAULT_NAME = "default"
SUFFIX = ".json"


class AlreadyRunningError(PreconditionError):
    """An instance of that name is running: its launcher's pid is alive."""

    def __init__(self, name: str, pid: int, path: Path) -> None:
        self.name = name
        self.pid = pid
        self.path = path
        super().__init__(
            f"instance {name!r} is already running (pid {pid}, state file {path}); "
            f"stop it with `cmemu down{name_option(name)}` or pick another --name"
        )


def check_name(name: str) -> str:
    """The name itself when it is a DNS label; InvalidArgumentError otherwise."""
    if not DNS_LABEL.match(name):
        raise InvalidArgumentError(
            f"bad instance name {name!r}: a DNS label is wanted (lower-case letters, digits "
            "and '-', at most 63, starting and ending with a letter or digit)"
        )
    return name


def name_option(name: str) -> str:
    """The `--name` option that selects `name` ("" for the default), for messages."""
    return "" if name == DEFAULT_NAME else f" --name {name}"


def state_dir() -> Path:
    if os.environ.get(DIR_ENV_VAR):
        return Path(os.environ[DIR_ENV_VAR])
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "cmemu"


def path_for(name: str = DEFAULT_NAME) -> Path:
    """The state file of the instance called `name`."""
    return state_dir() / f"{check_name(name)}{SUFFIX}"


def resolve(state_file: str | None = None, name: str | None = None) -> Path:
    """--state-file, else --name, else $CMEMU_STATE_FILE, else the default instance."""
    if state_file:
        return Path(state_file)
    if name is not None:
        return path_for(name)
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return path_for(DEFAULT_NAME)


def default_path() -> Path:
    return resolve()


def path_from(option: str | None) -> Path:
    """The --state-file option, or the default."""
    return resolve(option)


def tls_dir(path: Path) -> Path:
    """Where `--tls auto` puts the CA and the certificate of the instance of `path`."""
    return path.with_name(f"{instance_name(path)}-tls")


def instance_name(path: Path) -> str:
    """The instance a state file belongs to: its file name without `.json`."""
    return path.name.removesuffix(SUFFIX)


# --- the launcher record -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Launcher:
    """Who wrote a state file: enough for `cmemu status` and `cmemu down`."""

    pid: int
    mode: str
    started_wall_s: float | None = None  # time.time() when it wrote the state file
    run_dir: str | None = None  # procs and compose modes: their run directory
    argv: tuple[str, ...] = ()  # the `cmemu up` options, no secrets among them
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Launcher:
        known = {"pid", "mode", "started_wall_s", "run_dir", "argv"}
        return cls(
            pid=int(doc["pid"]),
            mode=str(doc.get("mode", "?")),
            started_wall_s=doc.get("started_wall_s"),
            run_dir=doc.get("run_dir"),
            argv=tuple(doc.get("argv") or ()),
            extra={k: v for k, v in doc.items() if k not in known},
        )

    @property
    def metrics(self) -> dict[str, str]:
        """Each process's /metrics URL, by process (none when its launcher serves none)."""
        return {str(k): str(v) for k, v in (self.extra.get(METRICS_KEY) or {}).items()}

    @property
    def ui(self) -> str | None:
        """The web view's URL, when its launcher serves one."""
        url = self.extra.get(UI_KEY)
        return str(url) if url else None


@dataclass(frozen=True, kw_only=True)
class Instance:
    """A state file read back: where it is, the topology, and who wrote it."""

    path: Path
    topology: Topology  # the first supernode's
    launcher: Launcher
    supernodes: tuple[Topology, ...] = ()  # every supernode's (several: a `<base>x<N>` preset)

    @property
    def name(self) -> str:
        return instance_name(self.path)

    @property
    def alive(self) -> bool:
        return pid_alive(self.launcher.pid)


def write(
    path: Path,
    topology: Topology,
    *,
    mode: str,
    launcher: Mapping[str, Any] | None = None,
    others: Sequence[Topology] = (),
) -> None:
    """Atomically: a reader never sees half a file. `launcher` adds fields to the launcher
    record (e.g. `run_dir`, `argv`: never a token); `started_wall_s` defaults to now. The file
    is the first supernode's document; `others` (the other supernodes') go in beside it."""
    doc: dict[str, Any] = dataclasses.replace(topology, links=()).to_dict()
    doc["links"] = LINKS_HERE
    if others:
        doc[OTHERS_KEY] = [t.to_dict() for t in others]
    doc["launcher"] = {
        "pid": os.getpid(),
        "mode": mode,
        "started_wall_s": time.time(),
        **(launcher or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as out:
        out.writelines(_document(doc, topology.links))
    tmp.replace(path)


LINKS_HERE = "\x00links\x00"  # where _document puts the links (no id or address holds a NUL)
LINKS_CHUNK = 1024


def _document(doc: Mapping[str, Any], links: Sequence[Link]) -> Iterator[str]:
    """The text json.dumps gives for `doc` with `links` in place of LINKS_HERE, byte for byte,
    with the links made into records and encoded a chunk at a time. Why: cm384's 12,672 links
    are 1.09 of the state file's 1.2 MB; their records and their text, all at once, were the
    peak of a cm384 start's memory (about 4 MiB above the servers', issue 18), in the last step
    before the file says the supernode is up."""
    head, tail = json.dumps(doc).split(json.dumps(LINKS_HERE))
    yield head + "["
    for start in range(0, len(links), LINKS_CHUNK):
        yield (", " if start else "") + json.dumps(records(links[start : start + LINKS_CHUNK]))[
            1:-1
        ]
    yield "]" + tail


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise NotFoundError(
            f"no running emulator: state file {path} not found (start one with `cmemu up`, "
            "or pass --name or --state-file)"
        ) from None


def read(path: Path) -> Topology:
    return Topology.from_json(_text(path))


def _supernodes(doc: Mapping[str, Any], first: Topology) -> tuple[Topology, ...]:
    return (first, *(Topology.from_dict(d) for d in doc.get(OTHERS_KEY) or ()))


def read_supernodes(path: Path) -> tuple[Topology, ...]:
    """Every supernode's document (one, but for a `<base>x<N>` preset)."""
    text = _text(path)
    first = Topology.from_json(text)  # a file that is not one says so (InvalidArgumentError)
    return _supernodes(json.loads(text), first)


def clients(path: Path) -> Clients:
    """Clients of the running emulator: any device of any of its supernodes, with the token
    and CA it was started with."""
    supernodes = read_supernodes(path)
    return Clients(supernodes[0], credentials(path), supernodes=supernodes)


# --- who may change state: the token and the CA, beside the state file ---------------------------

TOKEN_SUFFIX = ".token"
TOKEN_FILE_KEY = "token_file"  # launcher record: the file holding the token (never the token)
TLS_CA_KEY = "tls_ca"  # launcher record: the CA that signed the servers' certificates
MQTT_USER_KEY = "mqtt_user"  # launcher record: the broker's user, when it wants a login
METRICS_KEY = "metrics"  # launcher record: each process's /metrics URL, by process
UI_KEY = "ui"  # launcher record: the web view's URL (None: `cmemu up --ui none`)
PORTS_KEY = "ports"  # launcher record: the instance's block (ports.Block.record)
OTHERS_KEY = "other_supernodes"  # the documents of supernodes sn1, sn2, ... beside sn0's
PROCESSES_KEY = "processes"  # launcher record (procs mode): each process's pid and servers
CONTAINERS_KEY = "containers"  # launcher record (docker mode): the project, each service's servers


def processes_record(running: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The launcher record of a supervisor's processes (procs.Supervisor.running): what the
    process-kill and process-pause faults signal."""
    return {
        name: {"pid": r.proc.pid, "servers": list(r.spec.servers)} for name, r in running.items()
    }


def process_table(instance: Instance) -> ProcessTable:
    """The launcher's processes, for the process fault kinds (emulator/client/faultkinds)."""
    from cmemu.emulator.client.faultkinds.process import Process, ProcessTable

    mode = instance.launcher.mode.split()[0] if instance.launcher.mode else "?"
    raw = instance.launcher.extra.get(PROCESSES_KEY) or {}
    return ProcessTable(
        mode=mode,
        processes={
            str(name): Process(
                name=str(name), pid=int(doc["pid"]), servers=tuple(doc.get("servers") or ())
            )
            for name, doc in raw.items()
        },
    )


def containers_record(engine: DockerEngine) -> dict[str, Any]:
    """The launcher record of a compose project run by the engine: what the container fault
    kinds act on."""
    return {
        "project": engine.project,
        "servers": {k: list(v) for k, v in engine.servers.items()},
        "networks": {k: {n: list(a) for n, a in v.items()} for k, v in engine.networks.items()},
    }


def container_engine(instance: Instance) -> DockerEngine | None:
    """The engine's view of the instance's containers (docker mode), or None."""
    raw = instance.launcher.extra.get(CONTAINERS_KEY)
    if not raw:
        return None
    servers = {str(k): tuple(v) for k, v in (raw.get("servers") or {}).items()}
    networks = {
        str(k): {str(n): tuple(a) for n, a in v.items()}
        for k, v in (raw.get("networks") or {}).items()
    }
    from cmemu.emulator.runtime.docker import DockerEngine  # docker mode only: not every process's

    return DockerEngine(str(raw["project"]), servers=servers, networks=networks)


def fault_clients(path: Path) -> Clients:
    """Clients of the instance of state file `path` with what the fault kinds need beyond gRPC:
    the token and CA, the process table (procs mode) and the engine's containers (docker)."""
    from cmemu.emulator.client.faultkinds.container import attach_engine
    from cmemu.emulator.client.faultkinds.process import attach_processes

    instance = read_instance(path)
    clients = Clients(instance.topology, credentials(path), supernodes=instance.supernodes)
    attach_processes(clients, process_table(instance))
    engine = container_engine(instance)
    if engine is not None:
        attach_engine(clients, engine)
    return clients


def token_path(path: Path) -> Path:
    """Where `cmemu up` keeps the instance's token: beside its state file, `<name>.token`."""
    return path.with_name(f"{instance_name(path)}{TOKEN_SUFFIX}")


def write_token(path: Path, token: str) -> Path:
    """The instance's token in its own file (0600) beside the state file; that file's path."""
    out = token_path(path)
    write_secret(out, token + "\n")
    return out


def remove_token(path: Path) -> None:
    token_path(path).unlink(missing_ok=True)


def credentials(path: Path) -> Credentials:
    """What a client of the instance presents: the token of the file its launcher record names
    (`token_file`) and the CA it names (`tls_ca`); none when the record names none."""
    try:
        launcher = json.loads(_text(path)).get("launcher") or {}
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"state file {path} is not JSON: {exc}") from exc
    token_file, ca = launcher.get(TOKEN_FILE_KEY), launcher.get(TLS_CA_KEY)
    token = read_token(Path(token_file)) if token_file else None
    try:
        ca_pem = Path(ca).read_bytes() if ca else None
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the instance's CA {ca}: {exc}") from exc
    return Credentials(token=token, ca_pem=ca_pem)


def mqtt_login(path: Path) -> dict[str, str]:
    """The broker login of the instance's readers (`cmemu watch`): its launcher record's
    `mqtt_user` with the password derived from the token; none when the broker wants none."""
    try:
        launcher = json.loads(_text(path)).get("launcher") or {}
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"state file {path} is not JSON: {exc}") from exc
    user, token = launcher.get(MQTT_USER_KEY), credentials(path).token
    return {"username": str(user), "password": mqtt_password(token)} if user and token else {}


def read_instance(path: Path) -> Instance:
    """The topology and the launcher record; NotFoundError when there is no such file."""
    text = _text(path)
    topology = Topology.from_json(text)
    doc = json.loads(text)
    try:
        launcher = Launcher.from_dict(doc["launcher"])
    except (KeyError, TypeError, ValueError):
        raise InvalidArgumentError(f"state file {path} has no launcher record") from None
    return Instance(
        path=path, topology=topology, launcher=launcher, supernodes=_supernodes(doc, topology)
    )


def remove_if_ours(path: Path) -> None:
    """Remove the state file unless another emulator has since written its own there."""
    remove_if_written_by(path, os.getpid())


def remove_if_written_by(path: Path, pid: int) -> bool:
    """Remove the state file if the launcher `pid` wrote it; whether it did."""
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    if isinstance(doc, dict) and doc.get("launcher", {}).get("pid") == pid:
        path.unlink(missing_ok=True)
        return True
    return False


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists and has not exited (a zombie counts as exited)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc here: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def instances(directory: Path | None = None) -> list[Path]:
    """Every state file in the state directory, by name."""
    base = directory or state_dir()
    try:
        return sorted(p for p in base.glob(f"*{SUFFIX}") if DNS_LABEL.match(instance_name(p)))
    except OSError:
        return []
