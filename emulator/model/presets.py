"""Supernode presets: data in presets.toml, loaded and checked by one function."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from emulator.model.errors import InvalidArgumentError, UnknownNameError

PRESETS_FILE = Path(__file__).with_name("presets.toml")
SUPPORTED_VERSION = 1
SOURCES = ("pub", "derived", "extrapolated")
DEFAULT_PRESET = "cm384"


@dataclass(frozen=True, kw_only=True)
class Preset:
    name: str
    nodes: int
    source: str
    description: str
    l2_ports_per_chip: int | None = None  # None: the hardware profile's figure


_FIELDS = {"nodes", "source", "description", "l2_ports_per_chip"}


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
    return presets


@cache
def load_presets(path: Path = PRESETS_FILE) -> dict[str, Preset]:
    with path.open("rb") as f:
        return parse_presets(tomllib.load(f))


def get_preset(name: str) -> Preset:
    presets = load_presets()
    if name not in presets:
        raise UnknownNameError("preset", name, presets)
    return presets[name]
