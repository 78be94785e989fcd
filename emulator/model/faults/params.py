"""Typed fault parameters from a dict of text or values, as Toxiproxy takes a toxic's attributes.

A kind's parameters are one frozen dataclass; `params_from(cls, raw)` builds it from what a user
typed (`--param factor=0.5`) or a scenario file holds (`{factor: 0.5}`), refusing unknown names,
values of the wrong type and values outside a field's range with InvalidArgumentError naming the
parameter. A field's range is in its metadata (`positive`, `share`, `at_least`), so each kind states
its rules once, beside its fields.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cmemu.emulator.model.errors import InvalidArgumentError, quote

P = TypeVar("P")

POSITIVE = {"check": "positive"}  # > 0
SHARE = {"check": "share"}  # in (0, 1]: what remains of a rate
AT_LEAST_ZERO = {"check": "at_least_zero"}
FRACTION = {"check": "fraction"}  # in (0, 1): a duty cycle


def param(default: Any = None, help: str = "", check: dict[str, str] | None = None) -> Any:
    """A parameter with its help and range; no default makes it required."""
    metadata = {"help": help, **(check or {})}
    if default is None:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class NoParams:
    """A kind that takes no parameters."""


def unknown_kind(name: str, known: Iterable[str], *, plane: str = "") -> InvalidArgumentError:
    """The one error for a fault kind nobody registered (the client's catalogue, a device's
    kinds, the fabric's, the gateway's, a scenario's step), listing the known ones in the
    order given; `plane` says whose kinds they are ("device", "RDMA plane")."""
    whose = f"{plane} " if plane else ""
    return InvalidArgumentError(
        f"unknown {whose}fault kind {quote(name)}; known: {', '.join(known)}",
        field="kind",
        subject=name,
        reason="UNKNOWN_FAULT_KIND",
    )


def _bad(kind: str, name: str, message: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{kind}: parameter {name} {message}",
        field=f"params.{name}",
        subject=kind,
        reason="INVALID_FAULT_PARAM",
    )


def _number(kind: str, name: str, value: object, integral: bool) -> float | int:
    if isinstance(value, bool):
        raise _bad(kind, name, f"must be a number, got {quote(value)}")
    try:
        number: float | int = int(str(value), 0) if integral else float(str(value))
    except ValueError:
        what = "an integer" if integral else "a number"
        raise _bad(kind, name, f"must be {what}, got {quote(value)}") from None
    if not math.isfinite(number):
        raise _bad(kind, name, f"must be finite, got {quote(value)}")
    return number


def _bool(kind: str, name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _bad(kind, name, f"must be true or false, got {quote(value)}")


CHECKS: dict[str, tuple[Any, str]] = {
    "positive": (lambda v: v > 0, "must be > 0"),
    "share": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "at_least_zero": (lambda v: v >= 0, "must be >= 0"),
    "fraction": (lambda v: 0 < v < 1, "must be in (0, 1)"),
}


def _convert(kind: str, f: dataclasses.Field[Any], hint: Any, value: object) -> object:
    if hint is bool:
        out: object = _bool(kind, f.name, value)
    elif hint is int:
        out = _number(kind, f.name, value, integral=True)
    elif hint is float:
        out = float(_number(kind, f.name, value, integral=False))
    else:
        out = str(value)
        if len(out) > 256:
            raise _bad(kind, f.name, "is longer than 256 characters")
    check = f.metadata.get("check")
    if check is not None:
        ok, message = CHECKS[check]
        if not ok(out):
            raise _bad(kind, f.name, f"{message}, got {quote(value)}")
    return out


def params_from(cls: type[P], raw: Mapping[str, object], *, kind: str) -> P:
    """`cls` (a dataclass of bool/int/float/str fields) from `raw`; InvalidArgumentError on an
    unknown name, a bad value or a value out of its field's range."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        known = ", ".join(fields) or "none"
        raise InvalidArgumentError(
            f"{kind}: unknown parameter {quote(unknown[0])}; known: {known}",
            field=f"params.{unknown[0]}",
            subject=kind,
            reason="UNKNOWN_FAULT_PARAM",
        )
    values = {name: _convert(kind, fields[name], hints[name], value) for name, value in raw.items()}
    missing = [
        name
        for name, f in fields.items()
        if name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise _bad(kind, missing[0], "is required")
    made = cls(**values)
    check = getattr(made, "check", None)
    if check is not None:
        check()
    return made


def values(params: object) -> dict[str, object]:
    """A params dataclass's fields by name, as they are (what the wire carries)."""
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}  # type: ignore[arg-type]


def rechecked(params: P, *, kind: str) -> P:
    """`params` checked again as `params_from` checks what a user typed (a params object built
    in process skipped it): InvalidArgumentError naming the field out of its range."""
    return params_from(type(params), values(params), kind=kind)


def kind_params_checked(params: P, expected: type[Any], *, kind: str) -> P:
    """`params` if they are `kind`'s own class (`expected`) and in their ranges (`rechecked`):
    a fault built in process skipped the checks its typed or unpacked twin passed. Another
    kind's params are WRONG_FAULT_PARAMS, on either plane."""
    if type(params) is not expected:
        raise InvalidArgumentError(
            f"{kind}: its params are {expected.__name__}, not {type(params).__name__}",
            field="params",
            subject=kind,
            reason="WRONG_FAULT_PARAMS",
        )
    return rechecked(params, kind=kind)


def params_text(params: object) -> dict[str, str]:
    """A params dataclass as text (`wipe=true`), for logs and events."""
    return {
        name: ("true" if value else "false") if isinstance(value, bool) else f"{value}"
        for name, value in values(params).items()
    }


def describe(cls: type[Any]) -> list[tuple[str, str, str | None, str]]:
    """(name, type, default, help) of each parameter, for `cmemu fault kinds`; the default is
    None for a parameter that must be given."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default: str | None
        if f.default is not dataclasses.MISSING:
            default = str(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = str(f.default_factory())
        else:
            default = None
        rows.append((f.name, hints[f.name].__name__, default, str(f.metadata.get("help", ""))))
    return rows


def invalid(kind: str, name: str, message: str) -> InvalidArgumentError:
    """A cross-field check's error (a params class's `check`), shaped like the others."""
    return _bad(kind, name, message)
