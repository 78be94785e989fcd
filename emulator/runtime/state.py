"""The state file: how client commands find a running emulator.

`cmemu up` writes the topology document with live addresses (plus who wrote it) once every device
is SERVING, and removes it when it stops. `cmemu ls` and every later client command read it.
Default: $CMEMU_STATE_FILE, else $XDG_STATE_HOME/cmemu/state.json (~/.local/state/cmemu/...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from emulator.model.errors import NotFoundError
from emulator.model.topology import Topology

ENV_VAR = "CMEMU_STATE_FILE"


def default_path() -> Path:
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "cmemu" / "state.json"


def path_from(option: str | None) -> Path:
    """The --state-file option, or the default."""
    return Path(option) if option else default_path()


def write(path: Path, topology: Topology, *, mode: str) -> None:
    """Atomically: a reader never sees half a file."""
    doc: dict[str, Any] = topology.to_dict()
    doc["launcher"] = {"pid": os.getpid(), "mode": mode}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def read(path: Path) -> Topology:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise NotFoundError(
            f"no running emulator: state file {path} not found (start one with `cmemu up`, "
            "or pass --state-file)"
        ) from None
    return Topology.from_json(text)


def remove_if_ours(path: Path) -> None:
    """Remove the state file unless another emulator has since written its own there."""
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return
    if doc.get("launcher", {}).get("pid") == os.getpid():
        path.unlink(missing_ok=True)
