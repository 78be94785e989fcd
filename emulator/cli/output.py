"""Printing rows: a table for people, one JSON array for programs, from the same dicts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

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
