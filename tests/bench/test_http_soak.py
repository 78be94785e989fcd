"""The OpenAI endpoint's soak in its quickest mode (bench/http_soak.py): normal serving beside
hostile HTTP, every normal request within its SLOs (judged on emulated time), no 5xx, no hang,
silent connections closed. The ten-minute run is the benchmark's (README quotes it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _soak(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ROOT / "bench" / "http_soak.py"), *args]
    return subprocess.run(
        [*argv, "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_a_short_http_soak_passes(tmp_path: Path) -> None:
    run = _soak(tmp_path, "--seconds", "6")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((tmp_path / "http_soak.json").read_text())
    assert doc["passed"] is True
    assert doc["normal"]["requests"] == doc["normal"]["within_slo"] > 0
    hostile = doc["hostile"]
    assert hostile["requests"] > 0 and not hostile["server_errors"] and not hostile["hangs"]
    assert {"400", "401", "404"} <= set(hostile["statuses"])
    assert (tmp_path / "http_soak.png").exists()


def test_bad_options_are_a_usage_error(tmp_path: Path) -> None:
    run = _soak(tmp_path, "--seconds", "0")
    assert run.returncode == 2 and "error:" in run.stderr and not any(tmp_path.iterdir())
