"""Where a supernode's servers run: one typed dataclass per launch mode, each holding only the
options that mode reads and checking them when made (issue 18 item 6). LaunchOptions
(launchoptions.py) holds what every mode shares and one of these as its `mode`; each launcher
takes its own type, so an option of another mode cannot reach it (a per on an in-process
launch, a compose file on a procs one).

    LaunchOptions(preset="cm-mini", mode=Procs(per="device", plan=LoopbackPlan(first_octet=31)))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from cmemu.emulator.model.addressplans import (
    ENGINE_FIRST_OCTET,
    LoopbackPlan,
    PortPlan,
)
from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.runtime.image import IMAGE
from cmemu.emulator.runtime.serve import PER, Per

Mode = Literal["inprocess", "procs", "compose", "k8s", "docker"]
Addressing = Literal["ports", "loopback"]
MODES: tuple[Mode, ...] = ("inprocess", "procs", "compose", "k8s", "docker")
ADDRESSING: tuple[Addressing, ...] = ("ports", "loopback")
Plan = PortPlan | LoopbackPlan  # how a launcher of the preset gives each server its address
_PROJECT = re.compile(r"[a-z0-9_-]+")


def _check_plan(mode: str, plan: object) -> None:
    """A plan's figures: a port a socket can bind, a loopback block inside 127.0.0.0/8."""
    if isinstance(plan, PortPlan):
        if not plan.host:
            raise InvalidArgumentError(f"mode {mode}: the host to bind is empty")
        _check_port(mode, "base_port", plan.base_port)
    elif isinstance(plan, LoopbackPlan):
        _check_port(mode, "port", plan.port)
        if not 1 <= plan.first_octet <= 254:
            raise InvalidArgumentError(
                f"mode {mode}: first_octet {plan.first_octet}: 127.N with N from 1 to 254"
            )
    else:
        raise InvalidArgumentError(
            f"mode {mode}: plan must be a PortPlan or a LoopbackPlan, got {plan!r}"
        )


def _check_port(mode: str, what: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise InvalidArgumentError(f"mode {mode}: {what} {port}: from 1 to 65535")


def _check_per(mode: str, per: str) -> None:
    if per not in PER:
        raise UnknownNameError(f"mode {mode}: per", per, PER)


def _check_path(mode: str, what: str, path: object) -> None:
    if not isinstance(path, Path):
        raise InvalidArgumentError(f"mode {mode}: {what} must be a Path, got {path!r}")


@dataclass(frozen=True, kw_only=True)
class InProcess:
    """Every server in this process (the embedded default of `cmemu up`): a port each on one
    host, or (LoopbackPlan) an address 127.x.y.z each on one port."""

    name: ClassVar[Mode] = "inprocess"
    plan: Plan = field(default_factory=PortPlan)

    def __post_init__(self) -> None:
        _check_plan(self.name, self.plan)

    @property
    def uses_preset(self) -> bool:
        return True

    def describe(self, preset: str) -> str:
        """What `cmemu status` shows as the mode."""
        return self.name


@dataclass(frozen=True, kw_only=True)
class Procs:
    """The fabric, then one OS process per node (or per device), then EMS, each `cmemu serve`
    on its own loopback address by default (a PortPlan puts them on one host's ports)."""

    name: ClassVar[Mode] = "procs"
    per: Per = "node"
    plan: Plan = field(default_factory=LoopbackPlan)
    run_dir: Path | None = None  # logs, topology documents, EMS's SSD; default a temporary one

    def __post_init__(self) -> None:
        _check_per(self.name, self.per)
        _check_plan(self.name, self.plan)
        if self.run_dir is not None:
            _check_path(self.name, "run_dir", self.run_dir)

    @property
    def uses_preset(self) -> bool:
        return True

    def describe(self, preset: str) -> str:
        return f"procs per {self.per}"


@dataclass(frozen=True, kw_only=True)
class Compose:
    """Exactly the services of a compose file, as local processes (each hostname a loopback
    address); the file, not the preset, says what runs."""

    name: ClassVar[Mode] = "compose"
    file: Path
    run_dir: Path | None = None

    def __post_init__(self) -> None:
        _check_path(self.name, "file", self.file)
        if self.run_dir is not None:
            _check_path(self.name, "run_dir", self.run_dir)

    @property
    def uses_preset(self) -> bool:
        return False

    def describe(self, preset: str) -> str:
        return f"compose {self.file}"


@dataclass(frozen=True, kw_only=True)
class K8s:
    """Exactly the containers of a directory of Kubernetes manifests (`cmemu k8s`), as local
    processes; the manifests, not the preset, say what runs."""

    name: ClassVar[Mode] = "k8s"
    manifests: Path
    run_dir: Path | None = None

    def __post_init__(self) -> None:
        _check_path(self.name, "manifests", self.manifests)
        if self.run_dir is not None:
            _check_path(self.name, "run_dir", self.run_dir)

    @property
    def uses_preset(self) -> bool:
        return False

    def describe(self, preset: str) -> str:
        return f"k8s {self.manifests}"


@dataclass(frozen=True, kw_only=True)
class Docker:
    """A compose file run by the Docker engine: the one given, or the preset's generated with
    one container per device (or `per` node), published on 127.<engine_octet>.x.y."""

    name: ClassVar[Mode] = "docker"
    compose_file: Path | None = None
    per: Per | None = None  # generated file only: default one container per device
    image: str = IMAGE  # the emulator's image (`cmemu image build`)
    project: str | None = None  # the compose project (default cmemu-<pid>)
    engine_octet: int = ENGINE_FIRST_OCTET
    run_dir: Path | None = None  # the engine's compose file and secrets

    def __post_init__(self) -> None:
        if self.compose_file is not None:
            _check_path(self.name, "compose_file", self.compose_file)
            if self.per is not None:
                raise InvalidArgumentError(
                    "mode docker: per goes with a generated compose file, not a given one "
                    f"({self.compose_file}: its services say what runs)"
                )
        if self.per is not None:
            _check_per(self.name, self.per)
        if not self.image:
            raise InvalidArgumentError("mode docker: the image is empty")
        if self.project is not None and not _PROJECT.fullmatch(self.project):
            raise InvalidArgumentError(
                f"mode docker: compose project {self.project!r}: lower case, digits, - and _"
            )
        if not 1 <= self.engine_octet <= 254:
            raise InvalidArgumentError(
                f"mode docker: engine_octet {self.engine_octet}: 127.N with N from 1 to 254"
            )
        if self.run_dir is not None:
            _check_path(self.name, "run_dir", self.run_dir)

    @property
    def uses_preset(self) -> bool:
        """Whether the preset says what runs (else the compose file does)."""
        return self.compose_file is None

    @property
    def generated_per(self) -> Per:
        """What a generated compose file runs per container."""
        return self.per or "device"

    def describe(self, preset: str) -> str:
        return f"docker {self.compose_file or f'{preset} per {self.generated_per}'}"


ModeOptions = InProcess | Procs | Compose | K8s | Docker
MODE_TYPES: tuple[type[ModeOptions], ...] = (InProcess, Procs, Compose, K8s, Docker)
WithRunDir = Procs | Compose | K8s | Docker  # the modes that keep logs and files on disk
