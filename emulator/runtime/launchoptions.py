"""How to start a supernode: the options every launch mode shares and the mode's own
(launchmodes.py), checked when made (a bad time scale, an unknown preset, a mode that is not one
of the mode types), and what a launcher reports of its progress. Kept apart from the launchers
so that a tool can build options (and the CLI can describe them) without importing any
launcher.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cmemu.emulator.model.addressplans import AddressPlan, PortPlan
from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.presets import DEFAULT_PRESET, get_preset
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.tenants import Keys
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime.events import parse_broker_url
from cmemu.emulator.runtime.launchmodes import (
    ADDRESSING,
    MODE_TYPES,
    MODES,
    Addressing,
    Compose,
    Docker,
    InProcess,
    K8s,
    Mode,
    ModeOptions,
    Procs,
)
from cmemu.emulator.runtime.tls import TlsFiles

__all__ = [
    "ADDRESSING",
    "CMEMU",
    "EMBEDDED",
    "MODES",
    "NO_BROKER",
    "Addressing",
    "Compose",
    "Docker",
    "InProcess",
    "K8s",
    "LaunchOptions",
    "Mode",
    "ModeOptions",
    "Procs",
    "Progress",
    "StartInterrupted",
]

Progress = Callable[[str, int, int], None]
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
    """How to start a supernode: what every mode shares, and `mode`, where its servers run with
    that mode's own options (launchmodes.py). Every field has the default `cmemu up` has."""

    preset: str = DEFAULT_PRESET  # not read by Compose, K8s nor Docker with a file
    mode: ModeOptions = field(default_factory=InProcess)
    time_scale: float = 1.0  # emulated seconds per wall second: a ceiling (see dilation)
    # emulated time slows when the emulator cannot keep up (emulator/engines/clock.py); off,
    # it is wall time x time_scale, and a busy host shows as late replies and missed beats
    dilation: bool = True
    broker: str = EMBEDDED  # EMBEDDED, NO_BROKER, or mqtt://HOST:PORT
    # EMBEDDED: where it listens, HOST:PORT (`cmemu up`: in the instance's block, ports.py);
    # None: a free port of 127.0.0.1
    broker_address: str | None = None
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
        if not isinstance(self.mode, MODE_TYPES):
            raise InvalidArgumentError(
                f"mode must be one of {', '.join(m.__name__ + '(...)' for m in MODE_TYPES)}, "
                f"got {self.mode!r}"
            )
        if not self.time_scale > 0:
            raise InvalidArgumentError(f"time_scale must be > 0, got {self.time_scale}")
        if not self.drain_s >= 0:
            raise InvalidArgumentError(f"drain_s must be >= 0, got {self.drain_s}")
        if not self.ready_timeout_s > 0:
            raise InvalidArgumentError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")
        if self.broker not in (EMBEDDED, NO_BROKER):
            parse_broker_url(self.broker)
        if self.mode.uses_preset:
            get_preset(self.preset)

    @property
    def plan(self) -> AddressPlan:
        """The addresses of the mode's servers (in-process and procs modes: the others run
        files that carry their own)."""
        if not isinstance(self.mode, InProcess | Procs):
            raise InvalidArgumentError(
                f"mode {self.mode.name}: its files give the addresses, not an address plan"
            )
        return self.mode.plan

    @property
    def run_dir(self) -> Path | None:
        """Where the mode keeps logs and files (None: a temporary directory, or none)."""
        return None if isinstance(self.mode, InProcess) else self.mode.run_dir

    def supernodes(self) -> tuple[Topology, ...]:
        """The topology documents of the preset's supernodes (one unless it is `<base>x<N>`)
        with these addresses (in-process and procs modes only)."""
        plan = self.plan
        supernodes = _built(self.preset, plan, self.time_scale, self.profile)
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
        one_process = isinstance(self.mode, InProcess) or not isinstance(plan, PortPlan)
        if self.metrics and one_process:
            return supernodes
        return tuple(dataclasses.replace(t, metrics_port=None) for t in supernodes)

    def topology(self) -> Topology:
        """The first supernode's document (the only one, but for a `<base>x<N>` preset)."""
        return self.supernodes()[0]


def report(options: LaunchOptions, what: str, done: int, total: int) -> None:
    if options.progress is not None:
        options.progress(what, done, total)
