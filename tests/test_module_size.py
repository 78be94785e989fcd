"""No module of the emulator or its services over 500 lines, and no class over 300 (issue 18,
item 7).

A reader must find a thing where its name says it is: a module that grows past this has grown a
second concern, to be split along its seam (as linkgraph.py's routes and trunks were), not
allowed here. The generated wire code (cmemu/) and the tests are not held to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("emulator", "services")
MAX_LINES = 500
MAX_CLASS_LINES = 300  # a class past this holds a second job: a seam to cut along


def oversized(root: Path, packages: tuple[str, ...] = CHECKED) -> dict[str, int]:
    """Every module under `packages` of `root` over MAX_LINES, by path relative to `root`."""
    out: dict[str, int] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                out[path.relative_to(root).as_posix()] = lines
    return out


def oversized_classes(root: Path, packages: tuple[str, ...] = CHECKED) -> dict[str, int]:
    """Every class under `packages` of `root` over MAX_CLASS_LINES, as "path:Class"."""
    out: dict[str, int] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_CLASS_LINES:
                        out[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return out


def test_no_module_is_over_500_lines() -> None:
    over = oversized(ROOT)
    assert not over, (
        f"modules over {MAX_LINES} lines: {over}; split each along its seam (a cohesive group "
        "with a name of its own), do not add it to ALLOWED"
    )


@pytest.mark.parametrize(("lines", "caught"), [(MAX_LINES, False), (MAX_LINES + 1, True)])
def test_a_module_one_line_over_is_caught(tmp_path: Path, lines: int, caught: bool) -> None:
    module = tmp_path / "services" / "grown.py"
    module.parent.mkdir()
    module.write_text("x = 0\n" * lines, encoding="utf-8")
    (tmp_path / "emulator").mkdir()
    assert oversized(tmp_path) == ({"services/grown.py": lines} if caught else {})


def test_no_class_is_over_300_lines() -> None:
    over = oversized_classes(ROOT)
    assert not over, f"classes over {MAX_CLASS_LINES} lines: {over}; split each along its seam"


@pytest.mark.parametrize(
    ("lines", "caught"), [(MAX_CLASS_LINES, False), (MAX_CLASS_LINES + 1, True)]
)
def test_a_class_one_line_over_is_caught(tmp_path: Path, lines: int, caught: bool) -> None:
    module = tmp_path / "emulator" / "grown.py"
    module.parent.mkdir()
    body = "    x = 0\n" * (lines - 1)
    module.write_text(f"class Grown:\n{body}\n\ny = 1\n", encoding="utf-8")
    (tmp_path / "services").mkdir()
    assert oversized_classes(tmp_path) == ({"emulator/grown.py:Grown": lines} if caught else {})
