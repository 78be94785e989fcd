"""Installing the emulator claims one import name, `cmemu` (issue 18 item 8).

The repository keeps its top-level folders (`emulator/`, `services/`, the product card's layout);
`cmemu/emulator` and `cmemu/services` are links to them, so the installed packages are
`cmemu.v1`, `cmemu.emulator` and `cmemu.services`, and a generic name such as `services` stays free
for whatever else is installed beside the emulator. These tests build the real wheel and read it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--wheel-dir", str(out), str(ROOT)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (built,) = out.glob("*.whl")
    return zipfile.ZipFile(built)


def top_level(names: list[str]) -> set[str]:
    return {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}


def test_the_wheel_installs_only_the_cmemu_name(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert top_level(names) == {"cmemu"}
    for module in (
        "cmemu/v1/device_pb2.py",
        "cmemu/emulator/cli/entry.py",
        "cmemu/services/ub.py",
        "cmemu/emulator/runtime/webview/static/index.html",  # package data travels too
        "cmemu/services/serving/endpoint/openapi.json",
    ):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "cmemu = cmemu.emulator.cli.entry:main" in text
    assert "cmemu = cmemu.emulator.pytest_plugin" in text


def test_the_check_sees_a_generic_name() -> None:
    """Its must-fail twin: the same reading of a wheel that still ships a top-level `services`."""
    assert top_level(["cmemu/v1/a.py", "services/ub.py", "x-0.1.dist-info/RECORD"]) == {
        "cmemu",
        "services",
    }


def test_the_links_point_at_the_top_level_folders() -> None:
    for name in ("emulator", "services"):
        link = ROOT / "cmemu" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve()


def test_nothing_imports_the_old_top_level_names() -> None:
    """`import emulator...` would work from a checkout (its root is on sys.path) but not from an
    installed wheel: every import goes through `cmemu.`."""
    offenders = []
    for folder in ("emulator", "services", "tests", "bench", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                words = line.split()
                old = len(words) >= 2 and words[1].split(".")[0] in ("emulator", "services")
                if old and words[0] in ("from", "import"):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
