"""Scenario files: read, checked against scenarios/schema.json, parsed with the fault kinds'
parameter checks. A bad field is reported with its YAML path."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cmemu.emulator.model.chaos.scenario import Scenario, deployment_refs, parse_scenario
from cmemu.emulator.model.errors import InvalidArgumentError, NotFoundError
from cmemu.emulator.runtime.chaos.kinds import checkers

SCENARIOS_DIR = Path(__file__).resolve().parents[3] / "scenarios"
SCHEMA_FILE = SCENARIOS_DIR / "schema.json"


@cache
def schema() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return doc


def _yaml_path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top)"


def validate(doc: object) -> None:
    """Check `doc` against the JSON Schema; the first error, with its YAML path."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), e.message))
    if errors:
        e = errors[0]
        best = jsonschema.exceptions.best_match([e]) or e
        path = _yaml_path(best.absolute_path)
        raise InvalidArgumentError(f"{path}: {best.message}", field=path)


def parse_text(text: str, *, base: Path = Path("."), source: str = "scenario") -> Scenario:
    """A scenario from YAML text; deployment files it names are read relative to `base`."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"{source}: not YAML: {exc}") from exc
    # the parser's messages are sharper than the schema's where both would fail: parse first
    # with the checks that do not need the files, then hold the document to the schema
    documents: dict[str, Any] = {}
    for ref in deployment_refs(doc):
        path = (base / ref).resolve()
        try:
            documents[ref] = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise NotFoundError(f"{source}: deployment file {ref}: {exc.strerror}") from exc
    scenario = parse_scenario(doc, kinds=checkers(), documents=documents)
    validate(doc)
    return scenario


def load(path: Path) -> Scenario:
    try:
        text = path.read_text()
    except OSError as exc:
        raise NotFoundError(f"scenario {path}: {exc.strerror}") from exc
    return parse_text(text, base=path.parent, source=str(path))


def library() -> list[Path]:
    """The scenarios shipped in scenarios/."""
    return sorted(SCENARIOS_DIR.glob("*.yaml"))


def find(name_or_path: str) -> Path:
    """A scenario file by path, or by the name of one in the library."""
    path = Path(name_or_path)
    if path.exists():
        return path
    for candidate in (SCENARIOS_DIR / name_or_path, SCENARIOS_DIR / f"{name_or_path}.yaml"):
        if candidate.exists():
            return candidate
    known = ", ".join(p.stem for p in library())
    raise NotFoundError(f"no scenario file {name_or_path!r} (library: {known})")
