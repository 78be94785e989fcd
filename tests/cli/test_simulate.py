"""`cmemu simulate serving|calibrate` as a user runs them: a real process, files in, a report out;
bad files and fields get a message and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmemu.emulator.testing import run_cmemu

ROOT = Path(__file__).resolve().parents[2]
SMALL = str(ROOT / "examples/deployments/small.yaml")
SMALL_WORKLOAD = str(ROOT / "examples/workloads/small.yaml")


def test_simulate_serving_prints_a_report() -> None:
    done = run_cmemu("simulate", "serving", "--deployment", SMALL, "--workload", SMALL_WORKLOAD)
    assert done.returncode == 0, done.stderr
    assert "TPOT p50 / p90 / p99 (ms)" in done.stdout
    assert "KV prefix hit rate" in done.stdout


def test_simulate_serving_json_is_deterministic_and_seedable() -> None:
    args = ("simulate", "serving", "--deployment", SMALL, "--workload", SMALL_WORKLOAD, "--json")
    a, b = run_cmemu(*args), run_cmemu(*args)
    assert a.returncode == 0, a.stderr
    report = json.loads(a.stdout)
    assert report == json.loads(b.stdout)
    assert report["submitted"] == report["finished"] == 12
    assert report["output_tokens"] == 12 * 32
    other = json.loads(run_cmemu(*args, "--seed", "99").stdout)
    assert other != report


def test_simulate_serving_reads_a_mooncake_trace(tmp_path: Path) -> None:
    lines = (ROOT / "workloads/mooncake-synthetic.jsonl").read_text().splitlines()[:30]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    deployment = str(ROOT / "examples/deployments/deepseek-r1.yaml")
    done = run_cmemu(
        "simulate", "serving", "--deployment", deployment, "--workload", str(trace), "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["finished"] == 30


def test_simulate_calibrate_reports_every_point() -> None:
    done = run_cmemu("simulate", "calibrate", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["point"]: r for r in json.loads(done.stdout)}
    assert rows["decode TPOT"]["published"] == "0.0494"
    assert rows["prefill tokens/s per NPU"]["fitted"] == "fit"
    table = run_cmemu("simulate", "calibrate")
    assert "decode tokens/s per NPU" in table.stdout and "ERROR" in table.stdout


@pytest.mark.parametrize(
    ("deployment", "workload", "code", "message"),
    [
        ("missing.yaml", SMALL_WORKLOAD, 2, "cannot read missing.yaml"),
        ("BAD_FIELD", SMALL_WORKLOAD, 1, "INVALID_ARGUMENT"),
        ("BAD_YAML", SMALL_WORKLOAD, 1, "not valid YAML"),
        ("UNKNOWN_ROUTER", SMALL_WORKLOAD, 1, "unknown router 'random'"),
        (SMALL, "BAD_TRACE", 1, "line 2"),
        (SMALL, "BAD_WORKLOAD", 1, "rate_per_s must be > 0"),
    ],
)
def test_bad_files_and_fields(
    tmp_path: Path, deployment: str, workload: str, code: int, message: str
) -> None:
    files = {
        "BAD_FIELD": ("d.yaml", "decode: {npus: -1}\n"),
        "BAD_YAML": ("d.yaml", "decode: [1, 2\n"),
        "UNKNOWN_ROUTER": ("d.yaml", "router: random\n"),
        "BAD_TRACE": (
            "t.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"oops": 1}\n',
        ),
        "BAD_WORKLOAD": ("w.yaml", "rate_per_s: 0\n"),
    }

    def path(name: str) -> str:
        if name in files:
            file, text = files[name]
            (tmp_path / file).write_text(text)
            return str(tmp_path / file)
        return name

    done = run_cmemu(
        "simulate", "serving", "--deployment", path(deployment), "--workload", path(workload)
    )
    assert done.returncode == code
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_duration_is_a_usage_error() -> None:
    done = run_cmemu(
        "simulate",
        "serving",
        "--deployment",
        SMALL,
        "--workload",
        SMALL_WORKLOAD,
        "--duration",
        "0",
    )
    assert done.returncode == 2 and "argument --duration: must be a duration > 0" in done.stderr


def test_set_overrides_a_figure_and_the_report_lists_it(tmp_path: Path) -> None:
    args = ("simulate", "serving", "--deployment", SMALL, "--workload", SMALL_WORKLOAD)
    done = run_cmemu(
        *args,
        "--set",
        "npu.hbm_bytes_per_s_per_die=3.2e12",
        "--set",
        "switch.port_bytes_per_s=7e9",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["overrides"] == {
        "npu.hbm_bytes_per_s_per_die": 3.2e12,
        "switch.port_bytes_per_s": 7e9,
    }
    table = run_cmemu(*args, "--set", "npu.hbm_bytes_per_s_per_die=3.2e12")
    assert "override npu.hbm_bytes_per_s_per_die  3.2e+12" in table.stdout
    # without --set: no overrides listed
    plain = json.loads(run_cmemu(*args, "--json").stdout)
    assert plain["overrides"] == {}
    # the deployment file's hardware section, then --set on top of it
    doc = (ROOT / "examples/deployments/small.yaml").read_text()
    file = tmp_path / "d.yaml"
    file.write_text(doc + "hardware:\n  npu: {hbm_bytes_per_s_per_die: 2.4e+12}\n")
    both = run_cmemu(
        "simulate", "serving", "--deployment", str(file), "--workload", SMALL_WORKLOAD,
        "--set", "moe.collective_launch_s=1e-5", "--json",
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    assert json.loads(both.stdout)["overrides"] == {
        "npu.hbm_bytes_per_s_per_die": 2.4e12,
        "moe.collective_launch_s": 1e-5,
    }


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("gpu.hbm=1", "unknown hardware section 'gpu'; known: clock, cpu, ems"),
        ("npu.hbm=1", "unknown numeric figure of npu 'hbm'; known: cube_cores_per_die"),
        ("npu.hbm_bytes_per_die=lots", "npu.hbm_bytes_per_die: 'lots' is not a number"),
        ("npu.hbm_bytes_per_die=0", "npu.hbm_bytes_per_die must be a finite number > 0"),
        ("npu.hbm_bytes_per_s_per_die=-1e12", "must be a finite number > 0"),
        ("npu.hbm_bytes_per_die", "expected FIGURE=VALUE"),
    ],
)
def test_a_bad_set_is_a_message_and_exit_1(override: str, message: str) -> None:
    done = run_cmemu(
        "simulate", "serving", "--deployment", SMALL, "--workload", SMALL_WORKLOAD,
        "--set", override,
    )  # fmt: skip
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_what_if_that_leaves_the_weights_no_room_is_refused() -> None:
    deployment = str(ROOT / "examples/deployments/deepseek-r1.yaml")
    args = ("simulate", "serving", "--deployment", deployment, "--workload", SMALL_WORKLOAD)
    done = run_cmemu(*args, "--set", "npu.hbm_bytes_per_die=34e9")
    assert done.returncode == 1
    assert "a prefill die's weights (40.6 GB) and reserve (4.3 GB) do not fit" in done.stderr
    # the twin: three quarters of the HBM still holds them, and the report shows the bound
    fits = run_cmemu(*args, "--set", "npu.hbm_bytes_per_die=51.5e9", "--json")
    assert fits.returncode == 0, fits.stderr
    report = json.loads(fits.stdout)
    assert report["hbm_weights_fit"] and report["hbm_batch_per_die"] > 0
    assert report["hbm_bytes_per_die"] == 51.5e9


def test_slo_tpot_prints_the_operating_point_and_runs_at_it() -> None:
    deployment = str(ROOT / "examples/deployments/deepseek-r1.yaml")
    workload = str(ROOT / "examples/workloads/decode-4096-256.yaml")
    args = ("simulate", "serving", "--deployment", deployment, "--workload", workload)
    done = run_cmemu(*args, "--duration", "2", "--slo-tpot", "50ms")
    assert done.returncode == 0, done.stderr
    assert "operating point at TPOT <= 50 ms (4,096 + 256 tokens per request)" in done.stdout
    assert "batch per die 49 (HBM bound 306), 2 microbatches, TPOT 49.68 ms" in done.stdout
    doc = json.loads(run_cmemu(*args, "--duration", "2", "--slo-tpot", "0.03s", "--json").stdout)
    point = doc["operating_point"]
    assert point["tpot_s"] <= 0.03 and 0 < point["batch_per_die"] < 48
    assert point["microbatches"] == 1  # a small batch: a second would only re-read the weights
    assert doc["batch_per_die_max"] <= point["batch_per_die"]  # the run never exceeds it


@pytest.mark.parametrize(
    ("target", "code", "message"),
    [
        ("15ms", 1, "no batch meets TPOT 15 ms: the lowest, at 1 request per die, is"),
        ("fast", 2, "argument --slo-tpot: not a duration: 'fast'"),
        ("0ms", 2, "must be a duration > 0"),
        ("50 parsecs", 2, "not a duration"),
    ],
)
def test_a_bad_or_unreachable_slo_is_a_message(target: str, code: int, message: str) -> None:
    deployment = str(ROOT / "examples/deployments/deepseek-r1.yaml")
    done = run_cmemu(
        "simulate", "serving", "--deployment", deployment, "--workload", SMALL_WORKLOAD,
        "--slo-tpot", target,
    )  # fmt: skip
    assert done.returncode == code
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_calibrate_reports_the_eplb_and_multi_turn_points(tmp_path: Path) -> None:
    rows = {r["point"]: r for r in json.loads(run_cmemu("simulate", "calibrate", "--json").stdout)}
    assert rows["prefill perfect-EPLB gain"]["published"] == "0.1827"
    multi = rows["multi-turn TTFT gain (no published figure)"]
    assert multi["published"] == "none" and multi["error"] == "-"
    assert float(multi["model"]) > 1
    # without a trace the point is left out, the others stay
    done = run_cmemu("simulate", "calibrate", "--trace", "none", "--json")
    left = {r["point"] for r in json.loads(done.stdout)}
    assert "prefill perfect-EPLB gain" in left
    assert not any(name.startswith("multi-turn") for name in left)


@pytest.mark.parametrize(
    ("trace", "code", "message"),
    [
        ("missing.jsonl", 2, "cannot read missing.jsonl"),
        ("BAD_TRACE", 1, "line 2"),
        ("NO_TURNS", 1, "not a multi-turn trace"),
    ],
)
def test_calibrate_refuses_a_bad_trace(tmp_path: Path, trace: str, code: int, message: str) -> None:
    texts = {
        "BAD_TRACE": '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"oops": 1}\n',
        "NO_TURNS": '{"timestamp": 0, "input_length": 1024, "output_length": 1, '
        '"hash_ids": [1, 2]}\n',
    }
    if trace in texts:
        (tmp_path / "t.jsonl").write_text(texts[trace])
        trace = str(tmp_path / "t.jsonl")
    done = run_cmemu("simulate", "calibrate", "--trace", trace)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
