"""Supernode presets: data in presets.toml, loaded and checked by one function.

A preset `<base>x<N>` (cm384x2, cm-minix2, any N) is N supernodes of the base preset joined by
the RDMA scale-out plane, each with its gateway: `cm384x1` is one supernode with the plane. The
file registers the common ones so that `cmemu presets` lists them; any other N is made on demand.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError

PRESETS_FILE = Path(__file__).with_name("presets.toml")
SUPPORTED_VERSION = 1
SOURCES = ("pub", "derived", "extrapolated")
DEFAULT_PRESET = "cm384"


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A named supernode size (presets.toml): its nodes, supernodes and source."""

    name: str
    nodes: int
    source: str
    description: str
    l2_ports_per_chip: int | None = None  # None: the hardware profile's figure
    supernodes: int = 1
    scaleout: bool = False  # joined by the RDMA scale-out plane (a `<base>x<N>` preset)
    base: str | None = None  # a `<base>x<N>` preset's base


_FIELDS = {"nodes", "source", "description", "l2_ports_per_chip"}
_MULTI = re.compile(r"(?P<base>[a-z0-9-]+?)x(?P<count>[1-9][0-9]*)")


def multi(base: Preset, count: int) -> Preset:
    """`count` supernodes of `base` joined by the RDMA scale-out plane."""
    return replace(
        base,
        name=f"{base.name}x{count}",
        description=f"{count} x {base.name} joined by the RDMA scale-out plane",
        supernodes=count,
        scaleout=True,
        base=base.name,
    )


def parse_presets(document: dict[str, Any]) -> dict[str, Preset]:
    """Validate a presets document (already parsed from TOML) into Preset records."""
    version = document.get("version")
    if version != SUPPORTED_VERSION:
        raise InvalidArgumentError(
            f"presets version {version!r} unsupported; expected {SUPPORTED_VERSION}"
        )
    presets: dict[str, Preset] = {}
    for name, body in document.get("presets", {}).items():
        unknown = set(body) - _FIELDS
        if unknown:
            raise InvalidArgumentError(f"preset {name}: unknown keys {sorted(unknown)}")
        preset = Preset(name=name, **body)
        if not isinstance(preset.nodes, int) or preset.nodes < 1:
            raise InvalidArgumentError(f"preset {name}: nodes must be a positive integer")
        if preset.source not in SOURCES:
            raise InvalidArgumentError(f"preset {name}: source must be one of {SOURCES}")
        presets[name] = preset
    for name, count in document.get("multi", {}).items():
        match = _MULTI.fullmatch(name)
        if match is None or match["base"] not in presets or int(match["count"]) != count:
            raise InvalidArgumentError(f"multi-supernode preset {name}: expected <base>x{count}")
        presets[name] = multi(presets[match["base"]], count)
    return presets


@cache
def load_presets(path: Path = PRESETS_FILE) -> dict[str, Preset]:
    with path.open("rb") as f:
        return parse_presets(tomllib.load(f))


def get_preset(name: str) -> Preset:
    """A registered preset, or any `<base>x<N>` of a registered base."""
    presets = load_presets()
    if name in presets:
        return presets[name]
    match = _MULTI.fullmatch(name)
    if match is not None and match["base"] in presets and not presets[match["base"]].scaleout:
        return multi(presets[match["base"]], int(match["count"]))
    single = [p for p, preset in presets.items() if not preset.scaleout]
    raise UnknownNameError("preset", name, [*single, f"{DEFAULT_PRESET}x<N>"])
