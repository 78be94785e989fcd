"""Every benchmark, in its quickest mode, writes `<name>.json` with its figures and a PNG plot
into `--results DIR`.

Only the output is checked here (its keys, and that the plot is a PNG): the figures themselves
depend on a shared, noisy machine and are the benchmarks' to report, not a test's to assert.
The quickest modes that take more than a few seconds (cmemu up under load, cm384, the serving
model, a deployed model) are marked slow.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import outputs

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Quick:
    name: str
    args: tuple[str, ...]
    keys: frozenset[str]


QUICK = [
    Quick("alloc", ("--jobs", "300", "--seeds", "1"), frozenset({"allocation_rate", "runs"})),
    Quick(
        "boot",
        ("--preset", "cm-mini", "--runs", "1", "--broker", "none"),
        frozenset({"runs", "boot_s_median"}),
    ),
    Quick("fuzz", ("--seconds", "1"), frozenset({"calls", "statuses", "failure_count"})),
    Quick("metrics", ("--presets", "cm-mini", "--scrapes", "2"), frozenset({"cm-mini"})),
]
SLOW = [  # each over 5 s: together they would take this file past 20 s
    Quick(
        "gateway",
        ("--seconds", "0.3", "--concurrency", "2", "--bulk-mib", "8"),
        frozenset({"one_flow", "shared_port", "ops_per_second", "cpu_us_per_call"}),
    ),
    Quick(
        "ems",
        ("--preset", "cm-mini", "--seconds", "0.3", "--requests", "3", "--big-mib", "2"),
        frozenset({"throughput", "big_object", "hit_rate", "store"}),
    ),
    Quick(
        "webview",
        ("--presets", "cm-mini", "--seconds", "0.5", "--faults", "1", "--settle", "0.5"),
        frozenset({"seconds", "runs"}),
    ),
    Quick(
        "deploy",
        ("--preset", "cm-mini", "--events", "100", "--idle", "0.3"),
        frozenset({"modes", "mqtt_events_per_s"}),
    ),
    Quick(
        "serving", ("--quick",), frozenset({"speed", "decode", "prefix", "platforms", "issue24"})
    ),
    Quick(
        "serving_live", ("--streams", "1", "--repeat", "1"), frozenset({"saturation", "realtime"})
    ),
    Quick(
        "fabric",
        ("--seconds", "0.3", "--runs", "1", "--concurrency", "4"),
        frozenset({"ep320", "ub_rows", "moe_rows"}),
    ),
    Quick("scaleout", ("--quick",), frozenset({"series", "validation", "wall_s"})),
    Quick("day", (), frozenset({"serve-only", "calendar", "load", "cpu_s"})),
    Quick(
        "day_live",
        ("--hours", "3", "--start-hour", "21", "--hour-s", "30", "--streams", "1", "--warm"),
        frozenset({"plan", "client", "wall_s"}),
    ),
    Quick("pd", ("--seconds", "600"), frozenset({"dynamic", "fixed 3:1", "cpu_s", "seconds"})),
    Quick("peers", ("--rounds", "20", "--blocks", "2"), frozenset({"us_per_round"})),
    Quick(
        "hotpath",
        ("--preset", "cm-mini", "--calls", "64"),
        frozenset({"direct_us", "grpc_us", "cpu_ratios"}),
    ),
]


def bench(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python bench/NAME.py ARGS`, as the README runs it."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def check_written(quick: Quick, directory: Path) -> None:
    run = bench(quick.name, *quick.args, "--results", str(directory))
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads((directory / f"{quick.name}.json").read_text())
    assert quick.keys <= set(doc), sorted(doc)
    assert (directory / f"{quick.name}.png").read_bytes().startswith(outputs.PNG_MAGIC)
    assert f"wrote {directory / quick.name}.json and {directory / quick.name}.png" in run.stdout


@pytest.mark.parametrize("quick", QUICK, ids=lambda q: q.name)
def test_a_quick_benchmark_writes_json_and_a_png(quick: Quick, tmp_path: Path) -> None:
    check_written(quick, tmp_path / "out")  # a directory that does not exist yet


# deploy starts cm-mini in process mode and from its compose file, on their fixed loopback
# addresses: see tests/conftest.py
ONE_AT_A_TIME = {
    "deploy": (
        pytest.mark.xdist_group("loopback-procs"),
        pytest.mark.xdist_group("loopback-compose"),
    )
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "quick", [pytest.param(q, id=q.name, marks=ONE_AT_A_TIME.get(q.name, ())) for q in SLOW]
)
def test_a_slower_benchmark_writes_json_and_a_png(quick: Quick, tmp_path: Path) -> None:
    check_written(quick, tmp_path)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("boot", ("--runs", "0")),
        ("alloc", ("--seeds", "0")),
        ("fuzz", ("--seconds", "0")),
        ("ems", ("--requests", "0")),
        ("deploy", ("--events", "0")),
        ("deploy", ("--idle", "-1")),
        ("metrics", ("--scrapes", "0")),
        ("webview", ("--faults", "0")),
        ("serving", ("--seconds", "-1")),
        ("serving_live", ("--streams", "1,x")),
        ("fabric", ("--runs", "0")),
        ("scaleout", ("--expert-parallel", "0")),
        ("day", ("--peak", "0")),
        ("day_live", ("--streams", "0")),
        ("day_live", ("--hour-s", "0")),
        ("scenarios", ("--seeds", "0")),
        ("scenarios", ("--only", "no-such-scenario")),
    ],
)
def test_bad_options_are_a_usage_error_before_anything_runs(
    name: str, args: tuple[str, ...], tmp_path: Path
) -> None:
    run = bench(name, *args, "--results", str(tmp_path))
    assert run.returncode == 2
    assert "error:" in run.stderr and "Traceback" not in run.stderr
    assert not any(tmp_path.iterdir())


def test_the_shared_writer_writes_json_and_png(tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class Row:
        seconds: float

    path = outputs.write_json(tmp_path / "new", "x", {"row": Row(1.5), "path": tmp_path})
    assert json.loads(path.read_text()) == {"row": {"seconds": 1.5}, "path": str(tmp_path)}
    with outputs.figure(tmp_path / "new", "x", ncols=2) as (left, right):
        outputs.bars(left, ["a", "b"], {"measured": [1, 2]}, targets={"target": 1.5})
        outputs.over_time(right, [0, 1, 2], {"rss": [3, 4, 5]}, targets={"limit": 6})
    assert (tmp_path / "new" / "x.png").read_bytes().startswith(outputs.PNG_MAGIC)


def test_a_figure_that_fails_to_draw_writes_no_png(tmp_path: Path) -> None:
    with pytest.raises(KeyError), outputs.figure(tmp_path, "broken") as (ax,):
        ax.plot([1], [1])
        raise KeyError("a figure the benchmark did not have")
    assert not (tmp_path / "broken.png").exists()
