"""`python -m bench.soak` runs end to end: a few seconds of the soak against a real cm384.

Only the machinery is checked here (load, chaos, ledger, verification, report): the soak's own
targets need its full duration (RSS growth after a warm-up of seconds means nothing), and the
emulator findings it exists to surface are reported by the benchmark, not by this test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_runs_and_reports(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--seconds",
            "6",
            "--concurrency",
            "8",
            "--broker",
            "none",
            "--results",
            str(tmp_path),
        ],
        cwd=ROOT,  # `bench` is found from the repository root
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode in (0, 1), run.stderr[-3000:]
    lines = {line.split()[0] for line in run.stdout.splitlines() if line.strip()}
    for figure in (
        "soak_ops",
        "rss_growth_after_warmup",
        "errors_by_status",
        "unknown_or_internal",
        "lost_bytes",
        "lost_objects",
        "resurrected_objects",
    ):
        assert figure in lines, run.stdout
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["soak_ops"] > 100
    assert report["objects_checked"] > 0
    assert report["client_exceptions"] == 0, report["client_exception_examples"]
    assert report["series"]["rss_mb"] and max(report["series"]["rss_mb"]) > 0
