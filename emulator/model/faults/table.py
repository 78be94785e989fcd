"""A plane's table of fault kinds by name, each kind's module imported when the kind is first asked
for.

A fault kind is one module holding its whole story (fabric/link_down.py: link-down's params, help
and effect), named after the kind in Python's spelling (link-down: link_down); a plane's table
lists its kinds' names in their listing order. Every server of a boot holds the tables (a device
unpacks its faults' params by them, the fabric applies its faults by them), but none needs a kind
before its first fault (a few are named by the engines' code, and imported with it): imported at
once, the kinds' modules and their dataclasses were about 35 ms of a cm384 boot's imports. A kind
is imported when asked for by name (an injected fault, its params unpacked); a listing (`cmemu
fault kinds`, iterating the values) imports them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar


class Declared(Protocol):
    """What a table needs of a kind: its name and its params class."""

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> type[Any]: ...


K = TypeVar("K", bound=Declared)


def module_of(name: str) -> str:
    """The module of the kind `name`: its name in Python's spelling (l1-board: l1_board)."""
    return name.replace("-", "_")


class KindTable(Mapping[str, K]):
    """The kinds of one plane (`package`), by name in listing order. A name is known without an
    import (`in`, iteration, an unknown kind's error listing the known ones); a kind's module
    (package.<module_of(name)>, its `KIND`) is imported when the kind is first looked up."""

    def __init__(self, package: str, names: Iterable[str]) -> None:
        self._package = package
        self._names = tuple(names)
        self._known = frozenset(self._names)
        self._loaded: dict[str, K] = {}

    def __getitem__(self, name: str) -> K:
        held = self._loaded.get(name)
        if held is not None:
            return held
        if name not in self._known:
            raise KeyError(name)
        module = importlib.import_module(f"{self._package}.{module_of(name)}")
        kind: K = module.KIND
        if kind.name != name:  # a module and its kind named apart: found on the first lookup
            raise ImportError(f"{module.__name__} declares kind {kind.name!r}, not {name!r}")
        self._loaded[name] = kind
        return kind

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class ParamsTable(Mapping[str, type[Any]]):
    """Each kind's params class by name (what the wire's `oneof params` unpacks by), from its
    kinds' table: a kind's module is imported with the first look at its params."""

    def __init__(self, kinds: KindTable[Any]) -> None:
        self._kinds = kinds

    def __getitem__(self, name: str) -> type[Any]:
        params: type[Any] = self._kinds[name].params
        return params

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)
