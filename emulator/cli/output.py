"""Printing rows: a table for people, one JSON array for programs, from the same dicts."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Literal

# (key, header, format spec): "<14" left-aligned in 14, ">6" right-aligned, "" the last column
Column = tuple[str, str, str]


def print_rows(
    rows: Sequence[Mapping[str, object]], columns: Sequence[Column], *, as_json: bool
) -> None:
    if as_json:
        print(json.dumps(list(rows), indent=2))
        return
    print(" ".join(f"{header:{spec}}" for _, header, spec in columns).rstrip())
    for row in rows:
        print(" ".join(f"{row.get(key, '-')!s:{spec}}" for key, _, spec in columns).rstrip())


Wire = Literal["int64", "bytes"]
"""How a field's value is spelled in proto3 JSON where Python's json would spell it otherwise."""


def wire_dict(
    fields: Sequence[tuple[str, object] | tuple[str, object, Wire]], *, defaults: bool = False
) -> dict[str, object]:
    """A message's fields as google.protobuf.json_format.MessageToDict spells them (field names
    kept, in field-number order): a field at its default (0, "", False, empty) left out, a
    64-bit integer as a string, bytes as base64, a repeated field as a list. So `--json` reads
    the same whether a command prints a message or the domain value a typed client returned.
    `defaults` keeps the fields at their defaults (MessageToDict's
    always_print_fields_with_no_presence), after those set, as it orders them."""
    out: dict[str, object] = {}
    unset: dict[str, object] = {}  # MessageToDict shows the defaults after the fields set
    for name, value, *how in fields:
        at_default = (
            isinstance(value, bool | int | float | str | bytes | tuple | list) and not value
        )
        if at_default and not defaults:
            continue
        (unset if at_default else out)[name] = _spelled(value, how[0] if how else None)
    return {**out, **unset}


def _spelled(value: object, how: Wire | None) -> object:
    if how == "int64":
        return str(value)
    if how == "bytes" and isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return list(value) if isinstance(value, tuple) else value
