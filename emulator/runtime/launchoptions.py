"""How to start a supernode: the typed options of every launch mode, checked when made (a bad
mode, a compose file without compose mode, an unknown preset), and what a launcher reports of
its progress. Kept apart from the launchers so that a tool can build options (and the CLI can
describe them) without importing any launcher.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cmemu.emulator.model.addressplans import (
    CONTAINER_PORT,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
    ENGINE_FIRST_OCTET,
    PROCS_FIRST_OCTET,
    AddressPlan,
    LoopbackPlan,
    PortPlan,
)
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError, UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.presets import DEFAULT_PRESET, get_preset
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.tenants import Keys
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime.events import parse_broker_url
from cmemu.emulator.runtime.image import IMAGE
from cmemu.emulator.runtime.serve import PER, Per
from cmemu.emulator.runtime.tls import TlsFiles

Mode = Literal["inprocess", "procs", "compose", "k8s", "docker"]
Progress = Callable[[str, int, int], None]
Addressing = Literal["ports", "loopback"]
MODES: tuple[Mode, ...] = ("inprocess", "procs", "compose", "k8s", "docker")
ADDRESSING: tuple[Addressing, ...] = ("ports", "loopback")
EMBEDDED = "embedded"  # broker: an MQTT broker in this process, for this run
NO_BROKER = "none"  # broker: no MQTT at all
CMEMU = str(Path(sys.executable).parent / "cmemu")


_LAST_BUILT: list[tuple[tuple[str, AddressPlan, float], HardwareProfile, tuple[Topology, ...]]] = []


def _built(
    preset: str, plan: AddressPlan, time_scale: float, profile: HardwareProfile
) -> tuple[Topology, ...]:
    """build_cluster, remembered for the last arguments: a launch asks for its documents
    twice (the port block before it starts, the launcher when it starts) and cm384's take a
    tenth of a second to build. The documents are frozen, so sharing them is safe; the profile
    is compared by identity (it holds mappings and cannot be hashed)."""
    key = (preset, plan, time_scale)
    for known, known_profile, built in _LAST_BUILT:
        if known == key and known_profile is profile:
            return built
    built = build_cluster(preset, plan=plan, time_scale=time_scale, profile=profile)
    _LAST_BUILT[:] = [(key, profile, built)]
    return built


class StartInterrupted(EmulatorError):
    """The stop event was set while the supernode was still starting; everything is stopped."""


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How to start a supernode. Every field has the default `cmemu up` has."""

    preset: str = DEFAULT_PRESET
    mode: Mode = "inprocess"
    per: Per = "node"  # procs: one process per node (or per device)
    time_scale: float = 1.0  # emulated seconds per wall second: a ceiling (see dilation)
    # emulated time slows when the emulator cannot keep up (emulator/engines/clock.py); off,
    # it is wall time x time_scale, and a busy host shows as late replies and missed beats
    dilation: bool = True
    addressing: Addressing | None = None  # default: ports in process, loopback for procs
    host: str = DEFAULT_HOST  # ports: the address every server binds
    base_port: int = DEFAULT_BASE_PORT  # ports: the first server's port; the others follow
    port: int = CONTAINER_PORT  # loopback: every server's port
    first_octet: int = PROCS_FIRST_OCTET  # loopback: 127.<first_octet>.x.y upwards
    compose_file: Path | None = None  # compose, docker: the file whose services run
    image: str = IMAGE  # docker: the emulator's image (`cmemu image build`)
    project: str | None = None  # docker: the compose project (default cmemu-<pid>)
    engine_octet: int = ENGINE_FIRST_OCTET  # docker: containers published on 127.<this>.x.y
    k8s_dir: Path | None = None  # k8s: the directory of manifests whose containers run
    broker: str = EMBEDDED  # EMBEDDED, NO_BROKER, or mqtt://HOST:PORT
    # EMBEDDED: where it listens, HOST:PORT (`cmemu up`: in the instance's block, ports.py);
    # None: a free port of 127.0.0.1
    broker_address: str | None = None
    run_dir: Path | None = None  # procs, compose: logs and files; default a temporary directory
    drain_s: float = 0.2  # between NOT_SERVING and stop
    ready_timeout_s: float = 180.0  # for every server to answer SERVING
    profile: HardwareProfile = field(default=DEFAULT_PROFILE, repr=False)
    # who may change state (DESIGN principle 11): see emulator/runtime/security.py
    token: str | None = field(default=None, repr=False)  # guards every state-changing RPC
    keys: Keys | None = field(default=None, repr=False)  # a keys file: the endpoint's tenants
    insecure: bool = False  # accept binding beyond loopback without a token
    tls: TlsFiles | Literal["auto"] | None = None  # "auto": a CA and certificate for this run
    tls_dir: Path | None = None  # tls "auto": where they go (default a temporary directory)
    metrics: bool = True  # every process serves /metrics (emulator/runtime/metrics.py)
    # hears how far the start is: (what it is doing, servers SERVING, servers in all); for a
    # progress bar (`cmemu up` on a terminal). Called on the event loop, so it must not block.
    progress: Progress | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        checks: list[tuple[str, object, tuple[str, ...]]] = [
            ("mode", self.mode, MODES),
            ("per", self.per, PER),
        ]
        if self.addressing is not None:
            checks.append(("addressing", self.addressing, ADDRESSING))
        for what, value, known in checks:
            if value not in known:
                raise UnknownNameError(what, str(value), known)
        if not self.time_scale > 0:
            raise InvalidArgumentError(f"time_scale must be > 0, got {self.time_scale}")
        if (self.mode == "compose") > (self.compose_file is not None) or (
            self.compose_file is not None and self.mode not in ("compose", "docker")
        ):
            raise InvalidArgumentError(
                "a compose file goes with mode 'compose' (or 'docker'), and only with them"
            )
        if self.broker not in (EMBEDDED, NO_BROKER):
            parse_broker_url(self.broker)
        if (self.mode == "k8s") != (self.k8s_dir is not None):
            raise InvalidArgumentError(
                "a manifest directory goes with mode 'k8s', and only with it"
            )
        if self.mode not in ("compose", "k8s") and not (
            self.mode == "docker" and self.compose_file
        ):
            get_preset(self.preset)

    @property
    def plan(self) -> AddressPlan:
        """Process mode gives each device an address of its own, as a container has."""
        addressing = self.addressing or ("loopback" if self.mode == "procs" else "ports")
        if addressing == "loopback":
            return LoopbackPlan(port=self.port, first_octet=self.first_octet)
        return PortPlan(host=self.host, base_port=self.base_port)

    def supernodes(self) -> tuple[Topology, ...]:
        """The topology documents of the preset's supernodes (one unless it is `<base>x<N>`)
        with these addresses (not for compose, whose file carries its own)."""
        supernodes = _built(self.preset, self.plan, self.time_scale, self.profile)
        if not self.dilation:
            supernodes = tuple(dataclasses.replace(t, dilation=False) for t in supernodes)
        limit = self.profile.limits.live_supernodes_max
        if len(supernodes) > limit:
            raise InvalidArgumentError(
                f"preset {self.preset}: {len(supernodes)} supernodes; the live launchers start "
                f"at most {limit} (model mode takes up to "
                f"{self.profile.scaleout.max_supernodes}: `cmemu simulate scaleout`)"
            )
        # ports: one host has room for one /metrics, the in-process supernode's
        one_process = self.mode == "inprocess" or not isinstance(self.plan, PortPlan)
        if self.metrics and one_process:
            return supernodes
        return tuple(dataclasses.replace(t, metrics_port=None) for t in supernodes)

    def topology(self) -> Topology:
        """The first supernode's document (the only one, but for a `<base>x<N>` preset)."""
        return self.supernodes()[0]


def report(options: LaunchOptions, what: str, done: int, total: int) -> None:
    if options.progress is not None:
        options.progress(what, done, total)
