"""Serving benchmark, model mode (the engine in the discrete-event simulator, no services):

1. simulation speed: emulated seconds per wall second of the published DeepSeek-R1 layout (the
   EP320 decode instance and six EP32 prefill instances) under 4,096/256 traffic near the prefill
   capacity, and over the whole Mooncake trace (per wall second and per CPU second: the machine
   may be shared);
2. decode tokens/s per NPU of the EP320 instance at TPOT targets of 50, 30 and 15 ms (4,096/256)
   and at 50 ms with 1,024/1,024 and 2,048/256: the largest batch per die whose TPOT meets the
   target, for the best of MTP on/off and one or two microbatches (the simulator's decode step:
   the cost model with the fabric's collectives);
3. prefill tokens/s per NPU, simulated, with the default (static) expert placement and a
   perfectly balanced one;
4. throughput and TTFT at prefix reuse 12.5%, 50% and 90%, with and without the EMS prefix cache;
5. the same deployment on `cluster-roce` (8-NPU servers over RDMA): decode capacity at 50 ms and
   the 4,096/256 run;
6. issue 23's figures (bench/serving_issue23.py): the HBM-bound largest decode batch, the
   SLO-driven operating points at 15/30/50 ms on cm384 and cluster-roce, TTFT over the turns of
   multi-turn conversations with and without EMS, and the routers compared (kv-aware,
   prefix-aware, round-robin) on the Mooncake trace and on one shared prefix;
7. issue 24's model-mode figures, from their own benchmarks' runs: dynamic PD against fixed
   splits on the shifting mix (goodput; bench/pd.py, which also runs the live router with
   --live) and one emulated day served by day and trained by night (tokens, training steps,
   switch times; bench/day.py; the live compressed day is bench/day_live.py).

    python bench/serving.py [--seconds 300] [--results DIR]
    python bench/serving.py --seconds 5   # short runs (the Mooncake trace runs whole)
    python bench/serving.py --quick        # every section at its smallest (a smoke test)

Writes bench/results/serving.json and serving.png (its second row: issue 23's figures).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving import calibrate
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.des import simulate
from cmemu.emulator.model.serving.workload import generate, parse_workload

if TYPE_CHECKING:
    from matplotlib.axes import Axes

try:
    from bench import day, outputs, pd, progress, serving_issue23
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import day  # type: ignore[import-not-found, no-redef]
    import outputs  # type: ignore[import-not-found, no-redef]
    import pd  # type: ignore[import-not-found, no-redef]
    import progress  # type: ignore[import-not-found, no-redef]
    import serving_issue23  # type: ignore[import-not-found, no-redef]

ROOT = Path(__file__).resolve().parents[1]
BLOCK = DEFAULT_PROFILE.serving.block_tokens
RATE = 160  # req/s of 4,096-token prompts: above the six prefill instances' capacity (~132/s)


def deployment(**changes: Any) -> Deployment:
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())
    doc.update(changes)
    return parse_deployment(doc)


def workload(**fields: Any) -> Any:
    doc = {"input": 4096, "output": 256, "rate_per_s": 120, "duration_s": 60, "seed": 1}
    doc.update(fields)
    return parse_workload(doc)


def speed(seconds: float, trace_rows: int | None = None) -> dict[str, Any]:
    d = deployment()
    requests = list(generate(workload(rate_per_s=130, duration_s=seconds), block_tokens=BLOCK))
    simulate(d, requests[:20], duration_s=1.0)  # topology and collectives built once, as a warm-up
    start, cpu = time.perf_counter(), time.process_time()
    sim = simulate(d, requests, duration_s=seconds)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    trace = serving_issue23.mooncake(trace_rows)
    start, trace_cpu = time.perf_counter(), time.process_time()
    mooncake = simulate(d, trace)
    trace_wall, trace_cpu = time.perf_counter() - start, time.process_time() - trace_cpu
    return {
        "decode_4096_256": {
            "emulated_s": seconds,
            "wall_s": wall,
            "emulated_s_per_wall_s": seconds / wall,
            "cpu_s": cpu,
            "emulated_s_per_cpu_s": seconds / cpu,
            "requests": sim.report.submitted,
            "decode_steps": sim.report.decode_steps,
            "prefill_batches": sim.report.prefill_batches,
        },
        "mooncake_trace": {
            "emulated_s": mooncake.report.emulated_s,
            "wall_s": trace_wall,
            "emulated_s_per_wall_s": mooncake.report.emulated_s / trace_wall,
            "cpu_s": trace_cpu,
            "emulated_s_per_cpu_s": mooncake.report.emulated_s / trace_cpu,
            "requests": mooncake.report.submitted,
            "kv_hit_rate": mooncake.report.kv_hit_rate,
            "ttft_p50_s": mooncake.report.ttft_s.p50,
            "tpot_p50_s": mooncake.report.tpot_s.p50,
        },
    }


def decode_capacity(target_s: float, prompt: int, output: int, platform: str) -> dict[str, Any]:
    """The largest batch per die meeting the TPOT target, and its tokens/s per NPU."""
    moe = calibrate.fabric_moe(DEFAULT_PROFILE, platform)
    kv = prompt + output / 2
    best: dict[str, Any] = {"target_s": target_s, "met": False}
    lowest = float("inf")
    for mtp in (True, False):
        tokens_per_step = DEFAULT_PROFILE.serving.mtp_tokens_per_step if mtp else 1.0
        for micro in (1, 2):
            for batch in range(1, 257):
                step = calibrate.decode_step(
                    DEFAULT_PROFILE, moe, mtp=mtp, microbatches=micro, per_die=batch, kv_tokens=kv
                )
                tpot = step.total_s / tokens_per_step
                lowest = min(lowest, tpot)
                if tpot > target_s:
                    break
                per_npu = DEFAULT_PROFILE.npu.dies * batch / tpot
                if per_npu > best.get("tokens_per_s_per_npu", 0):
                    best = {
                        "target_s": target_s,
                        "met": True,
                        "tokens_per_s_per_npu": per_npu,
                        "batch_per_die": batch,
                        "tpot_s": tpot,
                        "mtp": mtp,
                        "microbatches": micro,
                    }
    best["lowest_tpot_s"] = lowest
    return best


DECODE_CASES = [(0.050, 4096, 256), (0.030, 4096, 256), (0.015, 4096, 256)]
DECODE_CASES += [(0.050, 1024, 1024), (0.050, 2048, 256)]
QUICK_DECODE_CASES = [(0.050, 4096, 256), (0.015, 4096, 256)]  # one met, one not
QUICK_SECONDS, QUICK_TRACE_ROWS = 3.0, 100
PD_SECONDS, QUICK_PD_SECONDS = 7200.0, 600.0  # the shifting mix: bench/pd.py's default, and less
DAY_PEAK = 300_000.0  # output tokens/s at the day's peak: bench/day.py's default


def decode(
    platform: str = "cm384", cases: list[tuple[float, int, int]] = DECODE_CASES
) -> list[dict[str, Any]]:
    return [
        {"prompt": p, "output": o, **decode_capacity(t, p, o, platform)}
        for t, p, o in progress.track(cases, "decode capacity")
    ]


def prefill() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for placement in ("static", "ideal"):
        d = deployment(placement=placement)
        w = workload(output=1, rate_per_s=200, duration_s=30)
        report = simulate(d, generate(w, block_tokens=BLOCK), duration_s=30).report
        out[placement] = {
            "prefill_tokens_per_s_per_npu": report.prefill_tokens_per_s_per_npu,
            "ttft_p50_s": report.ttft_s.p50,
        }
    return out


def prefix(seconds: float) -> list[dict[str, Any]]:
    rows = []
    runs = [(reuse, ems) for reuse in (0.125, 0.5, 0.9) for ems in (True, False)]
    for reuse, ems in progress.track(runs, "prefix-cache runs"):
        d = deployment(ems={"enabled": ems})
        w = workload(rate_per_s=RATE, duration_s=seconds, prefix_reuse=reuse, prefix_pool=64)
        r = simulate(d, generate(w, block_tokens=BLOCK), duration_s=seconds).report
        rows.append(
            {
                "prefix_reuse": reuse,
                "ems": ems,
                "tokens_per_s_per_npu": r.tokens_per_s_per_npu,
                "tokens_per_s": r.tokens_per_s,
                "ttft_p50_s": r.ttft_s.p50,
                "ttft_p90_s": r.ttft_s.p90,
                "kv_hit_rate": r.kv_hit_rate,
                "finished": r.finished,
            }
        )
    return rows


def platforms(seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for platform in ("cm384", "cluster-roce"):
        d = deployment(platform=platform)
        r = simulate(
            d, generate(workload(duration_s=seconds), block_tokens=BLOCK), duration_s=seconds
        ).report
        out[platform] = {
            "decode_at_50ms": decode_capacity(0.05, 4096, 256, platform),
            "tokens_per_s_per_npu": r.tokens_per_s_per_npu,
            "ttft_p50_s": r.ttft_s.p50,
            "tpot_p50_s": r.tpot_s.p50,
        }
    return out


def plot(figures: dict[str, Any], directory: Path) -> None:
    title = (
        "cmemu serving model: simulation "
        f"{figures['speed']['decode_4096_256']['emulated_s_per_cpu_s']:.0f} emulated s per CPU s "
        "(EP320 + 6x EP32, 4096/256)"
    )
    with outputs.figure(directory, "serving", nrows=2, ncols=3, size=(15, 9), title=title) as axes:
        serving_issue23.plot(axes[3:], figures["issue23"])
        _decode(axes[0], figures["decode"])
        _prefix(axes[1], figures["prefix"])
        plats = figures["platforms"]
        outputs.bars(
            axes[2],
            list(plats),
            {
                "decode at TPOT 50 ms": [
                    plats[n]["decode_at_50ms"].get("tokens_per_s_per_npu", 0) for n in plats
                ]
            },
            ylabel="decode tokens/s per NPU at TPOT 50 ms",
            title="what the supernode buys",
            value_format="%.0f",
        )


def _decode(ax: Axes, rows: list[dict[str, Any]]) -> None:
    """Decode capacity per TPOT target, against the published EP320 point."""
    labels = [f"{r['prompt']}/{r['output']}\n{r['target_s'] * 1e3:.0f} ms" for r in rows]
    ax.bar(labels, [r.get("tokens_per_s_per_npu", 0) for r in rows], color="tab:blue")
    ax.axhline(1943, color="grey", ls="--", lw=1, label="published 1,943 (4096/256, 49.4 ms)")
    for i, r in enumerate(rows):
        if not r["met"]:
            ax.text(i, 60, f"not reachable\n(min {r['lowest_tpot_s'] * 1e3:.0f} ms)", ha="center",
                    fontsize=8)  # fmt: skip
    ax.set_ylabel("decode tokens/s per NPU")
    ax.set_title("EP320 decode at a TPOT target")
    ax.legend(fontsize=8)


def _prefix(ax: Axes, prefix: list[dict[str, Any]]) -> None:
    """TTFT against prefix reuse, with and without the EMS prefix cache."""
    for ems, style in ((True, "-o"), (False, "--s")):
        pts = [r for r in prefix if r["ems"] is ems]
        ax.plot(
            [r["prefix_reuse"] * 100 for r in pts],
            [r["ttft_p50_s"] * 1e3 for r in pts],
            style,
            label=f"TTFT p50, EMS {'on' if ems else 'off'}",
        )
    ax.set_xlabel("prefix reuse (%)")
    ax.set_yscale("log")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_title(f"prefix reuse, 4096/256 at {RATE} req/s")
    ax.legend(fontsize=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="emulated seconds per run")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"every section at its smallest: {QUICK_SECONDS:g} emulated s per run, the first "
        f"{QUICK_TRACE_ROWS} requests of the Mooncake trace, two decode targets (a smoke test: "
        "its figures are not the benchmark's)",
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    seconds, rows = (QUICK_SECONDS, QUICK_TRACE_ROWS) if args.quick else (args.seconds, None)
    figures: dict[str, Any] = {"quick": args.quick, "speed": speed(seconds, rows)}
    print(json.dumps(figures["speed"], indent=1))
    figures["decode"] = decode(cases=QUICK_DECODE_CASES if args.quick else DECODE_CASES)
    for r in figures["decode"]:
        got = (
            f"{r['tokens_per_s_per_npu']:,.0f} tokens/s per NPU (batch {r['batch_per_die']}/die,"
            f" TPOT {r['tpot_s'] * 1e3:.1f} ms, MTP {r['mtp']}, {r['microbatches']} microbatches)"
            if r["met"]
            else f"not reachable (lowest TPOT {r['lowest_tpot_s'] * 1e3:.1f} ms)"
        )
        print(f"decode {r['prompt']}/{r['output']} at {r['target_s'] * 1e3:.0f} ms: {got}")
    figures["prefill"] = prefill()
    print("prefill", json.dumps(figures["prefill"]))
    figures["prefix"] = prefix(seconds / 2)
    for r in figures["prefix"]:
        print(
            f"reuse {r['prefix_reuse']:.1%} EMS {'on ' if r['ems'] else 'off'}: "
            f"{r['tokens_per_s_per_npu']:.1f} tokens/s per NPU, TTFT p50 "
            f"{r['ttft_p50_s'] * 1e3:.0f} ms p90 {r['ttft_p90_s'] * 1e3:.0f} ms, "
            f"hit {r['kv_hit_rate']:.1%}"
        )
    figures["platforms"] = platforms(seconds / 2)
    print("platforms", json.dumps(figures["platforms"], indent=1))
    figures["issue23"] = serving_issue23.collect(rows)
    serving_issue23.show(figures["issue23"])
    mix = pd.run(QUICK_PD_SECONDS if args.quick else PD_SECONDS)
    pd.report(mix)
    days = day.run(DAY_PEAK)
    day.report(days)
    figures["issue24"] = {
        "pd": {name: r.to_dict() for name, r in mix.items()},
        "day": {name: r.to_dict() for name, r in days.items()},
    }
    figures["profile"] = {k: getattr(DEFAULT_PROFILE.serving, k) for k in calibrate.FITTED}
    outputs.write_json(args.results, "serving", figures)
    plot(figures, args.results)
    outputs.announce(args.results, "serving")


if __name__ == "__main__":
    main()
