"""What-if studies (issue 23 item 6): a hardware profile with some of its figures replaced.

A study changes one input at a time, as users of Vidur or LLMCompass do:
`npu.hbm_bytes_per_s_per_die=3.2e12` names a figure of HardwareProfile by its dotted name (the one
`cmemu hardware` lists), and `npu.peak_ops_per_s_per_die.INT8=1.5e15` one entry of a table.
Only numeric figures can be overridden, and only with a finite value > 0: a zero bandwidth or a
negative capacity is not a machine, and a flag or a name is not a what-if; an efficiency,
utilisation, share or fraction is at most 1. Pure: the profile is
frozen, a new one is built.

`changed` answers the other way round: which figures of a profile differ from the default, so that
a report can list what it ran with however the profile was made.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile, figures


def parse_override(text: str) -> tuple[str, float]:
    """`section.figure=value` (the CLI's --set) as (dotted name, value)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InvalidArgumentError(
            f"--set {text!r}: expected FIGURE=VALUE, e.g. npu.hbm_bytes_per_s_per_die=3.2e12",
            field="set",
        )
    return name, _number(value.strip(), name)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name}: {value!r} is not a number", field=name)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InvalidArgumentError(f"{name}: {value!r} is not a number", field=name) from None
    if not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{name}: {value!r} is not a number", field=name)
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise InvalidArgumentError(f"{name} must be a finite number > 0, got {value!r}", field=name)
    return number


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numeric_names(section: Any) -> list[str]:
    out = []
    for item in dataclasses.fields(section):
        value = getattr(section, item.name)
        if _is_number(value):
            out.append(item.name)
        elif isinstance(value, Mapping) and all(_is_number(v) for v in value.values()):
            out.extend(f"{item.name}.{key}" for key in value)
    return out


_DIMENSIONLESS = ("efficiency", "utilisation", "share", "fraction")


def _check_dimensionless(name: str, number: float) -> None:
    """An efficiency, utilisation, share or fraction is a part of a whole: above 1 it would make
    a kernel faster than its hardware or a share larger than what it shares."""
    last = name.rsplit(".", 1)[-1]
    if any(last == word or last.endswith("_" + word) for word in _DIMENSIONLESS) and number > 1:
        raise InvalidArgumentError(
            f"{name} is dimensionless and at most 1, got {number!r}", field=name, subject=name
        )


def _coerce(old: Any, number: float, name: str) -> Any:
    """The new value in the old one's type: a count stays an integer."""
    if isinstance(old, int):
        if number != int(number):
            raise InvalidArgumentError(
                f"{name} is a whole number, got {number!r}", field=name, subject=name
            )
        return int(number)
    return number


def apply_overrides(
    profile: HardwareProfile, overrides: Mapping[str, Any] | Iterable[tuple[str, Any]]
) -> HardwareProfile:
    """`profile` with each named figure replaced (later entries win). Unknown sections and
    figures are UnknownNameError listing the valid ones; a value that is not a finite number > 0
    (or a fraction for a whole-number figure) is InvalidArgumentError."""
    items = overrides.items() if isinstance(overrides, Mapping) else overrides
    sections = {f.name for f in dataclasses.fields(profile)}
    changes: dict[str, dict[str, Any]] = {}
    for name, raw in items:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"a hardware figure is named by a string, not {name!r}")
        section_name, _, rest = name.partition(".")
        if section_name not in sections:
            raise UnknownNameError("hardware section", section_name, sections, field=name)
        section = getattr(profile, section_name)
        valid = _numeric_names(section)
        if rest not in valid:
            raise UnknownNameError(
                f"numeric figure of {section_name}",
                rest,
                valid,
                field=name,
                reason="UNKNOWN_HARDWARE_FIGURE",
            )
        number = _number(raw, name)
        _check_dimensionless(name, number)
        fields = changes.setdefault(section_name, {})
        key, _, entry = rest.partition(".")
        if entry:
            table = dict(fields.get(key, getattr(section, key)))
            table[entry] = _coerce(table[entry], number, name)
            fields[key] = table
        else:
            fields[key] = _coerce(getattr(section, key), number, name)
    replaced = {
        s: dataclasses.replace(getattr(profile, s), **fields) for s, fields in changes.items()
    }
    return dataclasses.replace(profile, **replaced)


def changed(profile: HardwareProfile, base: HardwareProfile = DEFAULT_PROFILE) -> dict[str, float]:
    """The numeric figures of `profile` that differ from `base` (dotted name: value), a table's
    entries one by one: what a what-if ran with."""
    if profile is base:
        return {}
    out: dict[str, float] = {}
    before = {name: value for name, value, _ in figures(base)}
    for name, value, _ in figures(profile):
        old = before.get(name)
        if isinstance(value, dict) and isinstance(old, dict):
            out.update({f"{name}.{k}": v for k, v in value.items() if old.get(k) != v})
        elif _is_number(value) and value != old:
            out[name] = value
    return out
