"""`cmemu serve-model`, `deployments`, `replay` and `undeploy` as a user runs them, against a real
`cmemu up` (its router and OpenAI endpoint)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cmemu.emulator import testing
from cmemu.emulator.cli import serving
from cmemu.emulator.client.deployments import deployment
from cmemu.emulator.model.topology import ServiceKind, build, server_count
from cmemu.emulator.runtime import state
from cmemu.emulator.testing import free_port_block, run_cmemu
from cmemu.v1 import router_pb2

cmemu = run_cmemu
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _trace(path: Path) -> None:
    """A Mooncake-format trace: six requests, the later ones sharing the first's two blocks."""
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 3]},
        {"timestamp": 400, "input_length": 900, "output_length": 6, "hash_ids": [4, 5]},
        {"timestamp": 900, "input_length": 1200, "output_length": 10, "hash_ids": [1, 2, 6]},
        {"timestamp": 1500, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 7]},
        {"timestamp": 2100, "input_length": 600, "output_length": 4, "hash_ids": [8, 9]},
        {"timestamp": 2600, "input_length": 1024, "output_length": 7, "hash_ids": [1, 2]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _post_status(state_file: Path) -> int:
    """The HTTP status of a completion request to the endpoint the state file names."""
    http = state.read(state_file).service(ServiceKind.ROUTER).http_address
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"http://{http}/v1/completions", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _check_usage(flags: tuple[str, ...]) -> None:
    """Metering: the one tenant (no token: `default`) used what the replays' usage says (both
    replays: all six requests, then the first two)."""
    usage = json.loads(cmemu("usage", "--format", "json", *flags).stdout)
    (default,) = usage["tenants"]
    assert default["tenant"] == "default" and default["requests"] == 6 + 2
    assert default["completion_tokens"] == 8 + 6 + 10 + 5 + 4 + 7 + (8 + 6)
    assert default["prompt_tokens"] == 1100 + 900 + 1200 + 1500 + 600 + 1024 + (1100 + 900)
    csv = cmemu("usage", "--format", "csv", *flags).stdout.splitlines()
    assert csv[0].startswith("tenant,priority,requests,prompt_tokens") and len(csv) == 2
    nobody = cmemu("usage", "--tenant", "nobody", *flags)
    assert nobody.returncode == 1 and "TENANT_NOT_FOUND" in nobody.stderr


def _check_pd_refused(flags: tuple[str, ...]) -> None:
    """Live dynamic PD on units whose dies cannot hold the weights: refused at deploy."""
    pd = cmemu(
        "serve-model", "deepseek-r1", "--decode", "2", "--prefill", "2x2", "--as", "pd",
        "--option", "pd=dynamic", *flags,
    )  # fmt: skip
    # a 2-NPU unit cannot hold DeepSeek-R1's weights: the cost model cannot rate it
    assert pd.returncode == 1 and "INVALID_ARGUMENT" in pd.stderr
    assert "do not fit its HBM" in pd.stderr


def test_serve_replay_undeploy(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    base = free_port_block(server_count(build("cm-mini")))
    up = ("--preset", "cm-mini", "--base-port", str(base), "--time-scale", "60")
    with testing.cmemu_up(state_file, *up, "--broker", "none", quiet=True):
        flags = ("--state-file", str(state_file))
        assert _post_status(state_file) == 503  # nothing deployed yet
        served = cmemu(
            "serve-model", "deepseek-r1", "--decode", "2", "--prefill", "1x2", "--as", "tiny",
            "--option", "decode.max_batch_per_die=8", "--option", "decode.tpot_target_s=1",
            "--wait", *flags,
        )  # fmt: skip
        assert served.returncode == 0, served.stderr
        out = served.stdout
        assert "deployment tiny: deepseek-r1, serving, 4 NPUs" in out
        assert "decode-0" in out and "prefill-0" in out and "experts per die" in out
        assert "weights 671 GB from cold" in out and "/v1" in out
        # said before waiting: the load's emulated and wall time at this time scale
        assert "loading 671 GB of weights cold, from object storage: 640 s emulated" in out
        assert "of wall time at time scale 60" in out

        listed = cmemu("deployments", *flags)
        assert listed.returncode == 0 and "tiny" in listed.stdout and "serving" in listed.stdout
        rows = json.loads(cmemu("deployments", "--json", *flags).stdout)
        assert [(r["name"], r["state"], r["npus"]) for r in rows] == [("tiny", "serving", 4)]
        assert rows[0]["split"] == "-" and rows[0]["pd"] is None  # no live dynamic PD

        trace = tmp_path / "trace.jsonl"
        _trace(trace)
        replayed = cmemu("replay", str(trace), "--model", "tiny", "--json", *flags)
        assert replayed.returncode == 0, replayed.stderr + replayed.stdout
        report = json.loads(replayed.stdout)
        assert (report["requests"], report["completed"], report["failed"]) == (6, 6, 0)
        assert report["output_tokens"] == 8 + 6 + 10 + 5 + 4 + 7
        assert report["ttft_s"]["p50"] > 0 and report["tpot_s"]["p50"] > 0
        assert report["prefix_hit_rate"] > 0  # requests 3, 4 and 6 share blocks 1 and 2
        assert report["goodput_per_s"] > 0 and 0 <= report["slo_attainment"] <= 1

        text = cmemu("replay", str(trace), "--limit", "2", *flags)  # the only deployment
        assert text.returncode == 0, text.stderr
        assert "2/2 requests" in text.stdout
        for word in ("TTFT ms", "TPOT ms", "goodput", "prefix-cache hits"):
            assert word in text.stdout

        _check_usage(flags)

        huge = cmemu("serve-model", "deepseek-r1", "--decode", "15", "--prefill", "1x4", *flags)
        assert huge.returncode == 1 and "RESOURCE_EXHAUSTED" in huge.stderr
        _check_pd_refused(flags)
        twice = cmemu("serve-model", "deepseek-r1", "--decode", "2", "--as", "tiny", *flags)
        assert twice.returncode == 1 and "FAILED_PRECONDITION" in twice.stderr

        gone = cmemu("undeploy", "tiny", *flags)
        assert gone.returncode == 0 and "undeployed tiny: 4 NPUs released" in gone.stdout
        again = cmemu("undeploy", "tiny", *flags)
        assert again.returncode == 1 and "NOT_FOUND" in again.stderr

        small = cmemu(
            "serve-model", "--deployment", str(EXAMPLES / "deployments" / "small.yaml"),
            "--as", "small", *flags,
        )  # fmt: skip
        assert small.returncode == 0, small.stderr
        assert "deployment small: deepseek-r1" in small.stdout
        assert "weights cold" not in small.stdout and "weights from EMS" in small.stdout
        nothing = cmemu("replay", str(trace), "--model", "nope", *flags)
        assert nothing.returncode == 1 and "NOT_FOUND" in nothing.stderr


def test_usage_errors(tmp_path: Path) -> None:
    flags = ("--state-file", str(tmp_path / "none.json"))
    for argv in (
        ["serve-model", "deepseek-r1", "--prefill", "3"],
        ["serve-model", "deepseek-r1", "--option", "novalue"],
        ["serve-model", *flags],
        ["serve-model", "--deployment", str(tmp_path / "missing.yaml"), *flags],
        ["replay", str(tmp_path / "missing.jsonl"), *flags],
        ["replay", "t.jsonl", "--speed", "0"],
    ):
        result = cmemu(*argv)
        assert result.returncode == 2, (argv, result.stderr)


def test_a_dynamic_pd_deployment_is_described_with_its_split_and_switches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = router_pb2.Deployment(name="pd", model="deepseek-r1", npus=6)
    d.instances.add(id="prefill-0", role="decode", npus=["n0", "n1"], dies=4)
    d.instances.add(id="prefill-1", role="prefill", npus=["n2", "n3"], dies=4)
    d.pd.policy = "dynamic"
    d.pd.prefill_units, d.pd.decode_units, d.pd.switching_units = 1, 1, 1
    d.pd.switches.add(
        at_ns=33_100_000_000, to="decode", instances=["prefill-0"], joined_ns=37_700_000_000
    )
    d.pd.switches.add(at_ns=61_000_000_000, to="prefill", instances=["decode-0"])
    described = deployment(d)  # as the typed router client returns it
    serving._describe(described, build("cm-mini"))
    out = capsys.readouterr().out
    assert "[decode]" in out and "[prefill]" in out  # each instance's role now
    assert "dynamic PD (dynamic): 1:1 prefill:decode, 1 switching; 2 switches" in out
    assert "33.1 s: prefill-0 to decode, joined 37.7 s" in out
    assert "61.0 s: decode-0 to prefill, switching" in out
    assert serving._pd(described)["switches"][0]["instances"] == ["prefill-0"]  # type: ignore[index]
