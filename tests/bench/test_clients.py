"""A real benchmark client against the endpoint (issue 24 item 7): aiperf, unmodified, with
DeepSeek-R1's tokenizer from the package directory, on cm-mini. Its token counts must equal the
responses' `usage`; its times are the benchmark's to report (bench/clients.py), not a test's to
assert. The comparison itself is shown able to fail on a record whose counts differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import clients

ROOT = Path(__file__).resolve().parents[2]
AIPERF = clients._executable("aiperf", None)


def _record(isl: int, usage_prompt: int, osl: int, usage_completion: int) -> str:
    metrics = {
        "input_sequence_length": {"value": isl},
        "usage_prompt_tokens": {"value": usage_prompt},
        "output_sequence_length": {"value": osl},
        "usage_completion_tokens": {"value": usage_completion},
        "time_to_first_token": {"value": 100.0},
        "inter_token_latency": {"value": 10.0},
    }
    return json.dumps({"metadata": {}, "metrics": metrics}) + "\n"


def test_the_count_check_can_fail(tmp_path: Path) -> None:
    path = tmp_path / "profile_export.jsonl"
    path.write_text(_record(128, 128, 8, 8) + _record(128, 131, 8, 8) + _record(64, 64, 8, 7))
    measured = clients._aiperf_report(path)
    assert measured.requests == 3 and measured.count_mismatches == 2
    assert measured.prompt_tokens == 128 + 131 + 64


@pytest.mark.slow
@pytest.mark.skipif(
    AIPERF is None and not os.environ.get("CI"),
    reason="aiperf is not installed (.ci/run makes .venv-aiperf; see bench/clients.py)",
)
def test_aiperf_counts_what_usage_says(tmp_path: Path) -> None:
    assert AIPERF is not None, "CI installs aiperf into .venv-aiperf (.ci/run)"
    argv = [
        sys.executable, str(ROOT / "bench" / "clients.py"), "--clients", "aiperf",
        "--requests", "6", "--concurrency", "2", "--isl", "128", "--osl", "8",
        "--results", str(tmp_path),
    ]  # fmt: skip
    run = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    doc = json.loads((tmp_path / "clients.json").read_text())
    verdict = doc["clients"]["aiperf"]
    measured = verdict["measured"]
    assert measured["requests"] == 6 and measured["count_mismatches"] == 0
    assert measured["prompt_tokens"] == 6 * 128 and measured["completion_tokens"] == 6 * 8
    assert isinstance(verdict["kept_pace"], bool)
    assert "client counts equal usage" in run.stdout
