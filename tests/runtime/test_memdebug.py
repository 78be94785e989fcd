"""The memory probe ($CMEMU_MEMDEBUG, SIGUSR2): off by default; on, each signal to a running
supernode writes a report that names what was allocated since tracing started and where."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmemu.emulator.runtime import memdebug
from cmemu.emulator.runtime.memdebug import MemDebug
from cmemu.emulator.testing import running_supernode


class Hoarded:
    """What the test makes the process hold between two reports."""

    def __init__(self) -> None:
        self.block = bytearray(10_000)


def hoard(n: int) -> list[Hoarded]:
    return [Hoarded() for _ in range(n)]


@pytest.fixture
def no_tracing() -> Iterator[None]:
    assert not tracemalloc.is_tracing()
    yield
    tracemalloc.stop()


def test_off_unless_the_environment_asks() -> None:
    assert MemDebug.from_env({}) is None
    assert MemDebug.from_env({memdebug.ENV: ""}) is None
    probe = MemDebug.from_env({memdebug.ENV: "/tmp/x"})
    assert probe is not None
    assert (probe.directory, probe.frames, probe.trim) == (Path("/tmp/x"), 8, True)
    probe = MemDebug.from_env(
        {memdebug.ENV: "/tmp/x", memdebug.FRAMES_ENV: "0", memdebug.TRIM_ENV: "0"}
    )
    assert probe is not None and (probe.frames, probe.trim) == (0, False)
    probe = MemDebug.from_env({memdebug.ENV: "/tmp/x", memdebug.FRAMES_ENV: "many"})
    assert probe is not None and probe.frames == memdebug.DEFAULT_FRAMES


def test_the_second_report_names_what_grew_and_where(no_tracing: None, tmp_path: Path) -> None:
    probe = MemDebug(tmp_path, frames=4)
    first = probe.report()
    assert "tracemalloc started (4 frames)" in first
    assert tracemalloc.is_tracing()
    held = hoard(3000)
    second = probe.report()
    # by type: 3,000 more of them than at the first report
    assert re.search(r"^\s+\+3000\s+Hoarded$", second, re.MULTILINE), second
    # by traceback: the 30 MB, allocated in hoard() (or the constructor it calls)
    table = second.split("held of what was allocated since tracing started")[1]
    assert "test_memdebug.py" in table.split("\n\n")[0]
    assert "malloc_trim(0): rss" in second
    assert len(held) == 3000


def test_without_frames_nothing_is_traced(tmp_path: Path) -> None:
    probe = MemDebug(tmp_path, frames=0, trim=False)
    probe.report()
    report = probe.report()
    assert not tracemalloc.is_tracing()
    assert "tracemalloc" not in report and "malloc_trim" not in report
    assert "change since the last report:" in report


async def test_sigusr2_to_a_running_supernode_writes_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(memdebug.ENV, str(tmp_path / "reports"))
    monkeypatch.setenv(memdebug.FRAMES_ENV, "0")  # tracing would slow the rest of the session
    async with running_supernode("cm-mini"):
        os.kill(os.getpid(), signal.SIGUSR2)
        report = tmp_path / "reports" / f"memdebug-{os.getpid()}-1.txt"
        async with asyncio.timeout(60):
            while not report.exists():  # noqa: ASYNC110 (a file, written by the probe's task)
                await asyncio.sleep(0.05)
        text = report.read_text()
    assert text.startswith(f"memdebug report 1 of pid {os.getpid()}")
    assert "live objects by type" in text and "asyncio tasks:" in text
    # the probe ended with the supernode: SIGUSR2 is no longer handled by it
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)
