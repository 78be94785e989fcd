"""A figure with its source: the field every profile section is made of, and the units they use.

The profile lists each figure with where it comes from (`cmemu hardware`, hardware.figures), so
every section declares its fields through `fig`, the hardware's and the emulator's own alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from types import MappingProxyType
from typing import Any

GB = 1e9
GiB = 2**30


def fig(value: Any, src: str) -> Any:
    """A dataclass field carrying its source, so that the profile can be listed with provenance."""
    if isinstance(value, Mapping):
        frozen = MappingProxyType(dict(value))
        return field(default_factory=lambda: frozen, metadata={"src": src})
    return field(default=value, metadata={"src": src})
