"""Model-mode figures of issue 23, for bench/serving.py (which prints them and writes them into
serving.json): the HBM-bound largest decode batch, SLO-driven operating points at 15/30/50 ms on
cm384 and cluster-roce, TTFT over the turns of multi-turn conversations with and without EMS, and
the kv-aware router against round-robin (and prefix-aware) on the Mooncake trace and on one shared
prefix.

    python bench/serving_issue23.py      # these alone (about a minute of CPU)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cmemu.emulator.model.errors import PreconditionError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.serving.deployment import Deployment, parse_deployment
from cmemu.emulator.model.serving.des import Simulation, simulate
from cmemu.emulator.model.serving.engine import Request
from cmemu.emulator.model.serving.hbm import die_memory
from cmemu.emulator.model.serving.models import get_model
from cmemu.emulator.model.serving.operating import operating_point
from cmemu.emulator.model.serving.workload import generate, parse_workload, read_mooncake

if TYPE_CHECKING:
    from matplotlib.axes import Axes

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

ROOT = Path(__file__).resolve().parents[1]
BLOCK = DEFAULT_PROFILE.serving.block_tokens
ROUTER_NAMES = ("kv-aware", "prefix-aware", "round-robin")


def deployment(**changes: Any) -> Deployment:
    doc = yaml.safe_load((ROOT / "examples/deployments/deepseek-r1.yaml").read_text())
    doc.update(changes)
    return parse_deployment(doc)


def hbm_bound() -> list[dict[str, Any]]:
    """The largest decode batch per die whose KV caches and activations fit beside the weights."""
    d = deployment()
    memory = die_memory(
        get_model(d.model), d.decode_ep(DEFAULT_PROFILE), mtp=d.decode.mtp, profile=DEFAULT_PROFILE
    )
    rows = []
    for prompt, output in ((1024, 1024), (2048, 256), (4096, 256), (32768, 1024)):
        context = prompt + output
        rows.append(
            {
                "prompt": prompt,
                "output": output,
                "hbm_batch_per_die": memory.max_batch(context),
                "free_bytes_per_die": memory.free_bytes,
                "request_bytes": memory.request_bytes(context),
            }
        )
    return rows


def slo_points() -> dict[str, list[dict[str, Any]]]:
    """The SLO-driven operating point (`--slo-tpot`) at 15, 30 and 50 ms, 4,096/256, per
    platform."""
    out: dict[str, list[dict[str, Any]]] = {}
    for platform in ("cm384", "cluster-roce"):
        d = deployment(platform=platform)
        rows = []
        for target in (0.015, 0.030, 0.050):
            try:
                p = operating_point(d, target, prompt_tokens=4096, output_tokens=256)
            except PreconditionError as exc:
                rows.append({"target_s": target, "met": False, "why": str(exc)})
                continue
            rows.append(
                {
                    "target_s": target,
                    "met": True,
                    "batch_per_die": p.batch_per_die,
                    "tpot_s": p.tpot_s,
                    "tokens_per_s_per_npu": p.tokens_per_s_per_npu,
                    "hbm_batch_per_die": p.hbm_batch_per_die,
                }
            )
        out[platform] = rows
    return out


def multi_turn() -> dict[str, Any]:
    """TTFT p50 per turn of eight-turn conversations (examples/workloads/multi-turn.yaml, all
    of its turns), with and without the EMS prefix cache."""
    w = parse_workload(yaml.safe_load((ROOT / "examples/workloads/multi-turn.yaml").read_text()))
    requests = list(generate(w, block_tokens=BLOCK))
    out: dict[str, Any] = {"turns": w.turns, "conversations": len(requests) // w.turns}
    for ems in (True, False):
        sim = simulate(deployment(ems={"enabled": ems}), requests)
        out["ems" if ems else "no_ems"] = {
            "ttft_p50_s_by_turn": sim.report.ttft_p50_s_by_turn,
            "kv_hit_rate": sim.report.kv_hit_rate,
            "ems_loaded_bytes": sim.report.ems_loaded_bytes,
            "prefill_hbm_hit_blocks": sim.report.prefill_hbm_hit_blocks,
        }
    return out


def _router_row(sim: Simulation) -> dict[str, Any]:
    counts = sim.engine.stats.prefill_requests
    r = sim.report
    return {
        "ttft_p50_s": r.ttft_s.p50,
        "ttft_p90_s": r.ttft_s.p90,
        "ttft_p99_s": r.ttft_s.p99,
        "busiest_prefill_share": max(counts.values()) / sum(counts.values()),
        "prefill_requests": dict(sorted(counts.items())),
        "kv_hit_rate": r.kv_hit_rate,
    }


def shared_prefix() -> list[Request]:
    """One shared prefix (90% of 8,192-token prompts) at 20 requests/s, the first request a
    second ahead of the rest (tests/model/serving/test_routing.py's case)."""
    w = parse_workload(
        {
            "input": 16 * BLOCK,
            "output": 32,
            "rate_per_s": 20,
            "duration_s": 15,
            "prefix_reuse": 0.9,
            "prefix_pool": 1,
            "seed": 5,
        }
    )
    requests = list(generate(w, block_tokens=BLOCK))
    late = [dataclasses.replace(r, arrival_s=r.arrival_s + 1.0) for r in requests[1:]]
    return [requests[0], *late]


def mooncake(rows: int | None = None) -> list[Request]:
    """The Mooncake trace, whole or its first `rows` requests (a quick run)."""
    lines = (ROOT / "workloads/mooncake-synthetic.jsonl").read_text().splitlines()
    return read_mooncake(lines[:rows], block_tokens=BLOCK)


def routers(trace_rows: int | None = None) -> dict[str, Any]:
    trace = mooncake(trace_rows)
    shared = shared_prefix()
    out: dict[str, Any] = {"mooncake": {}, "shared_prefix": {}}
    for name in ROUTER_NAMES:
        out["mooncake"][name] = _router_row(simulate(deployment(router=name), trace))
        out["shared_prefix"][name] = _router_row(simulate(deployment(router=name), shared))
    return out


def collect(trace_rows: int | None = None) -> dict[str, Any]:
    return {
        "hbm_bound": hbm_bound(),
        "slo": slo_points(),
        "multi_turn": multi_turn(),
        "routers": routers(trace_rows),
    }


def show(figures: dict[str, Any]) -> None:
    for r in figures["hbm_bound"]:
        print(
            f"HBM bound {r['prompt']}/{r['output']}: {r['hbm_batch_per_die']} requests per die "
            f"({r['request_bytes'] / 1e9:.2f} GB each of {r['free_bytes_per_die'] / 1e9:.1f} GB)"
        )
    for platform, rows in figures["slo"].items():
        for r in rows:
            got = (
                f"batch {r['batch_per_die']}/die, TPOT {r['tpot_s'] * 1e3:.1f} ms, "
                f"{r['tokens_per_s_per_npu']:,.0f} tokens/s per NPU"
                if r["met"]
                else r["why"]
            )
            print(f"SLO {r['target_s'] * 1e3:.0f} ms on {platform}: {got}")
    mt = figures["multi_turn"]
    for key in ("ems", "no_ems"):
        ms = " ".join(f"{t * 1e3:.0f}" for t in mt[key]["ttft_p50_s_by_turn"])
        print(f"multi-turn TTFT p50 by turn (ms), {key.replace('_', ' ')}: {ms}")
    for trace, rows in figures["routers"].items():
        for name, r in rows.items():
            print(
                f"router {name} on {trace}: TTFT p50 {r['ttft_p50_s'] * 1e3:.0f} ms, p90 "
                f"{r['ttft_p90_s'] * 1e3:.0f} ms, busiest prefill instance "
                f"{r['busiest_prefill_share']:.0%} of requests"
            )


def plot(axes: list[Axes], figures: dict[str, Any]) -> None:
    """Three panels: the HBM-bound batch per length, the SLO operating points on both
    platforms, TTFT over the turns of a conversation with and without EMS."""
    hbm = figures["hbm_bound"]
    outputs.bars(
        axes[0],
        [f"{r['prompt']}/{r['output']}" for r in hbm],
        {"largest batch HBM holds": [r["hbm_batch_per_die"] for r in hbm]},
        ylabel="decode requests per die (EP320)",
        title="what HBM holds (weights, KV, activations)",
        value_format="%.0f",
    )
    slo = figures["slo"]
    targets = [r["target_s"] for r in next(iter(slo.values()))]
    outputs.bars(
        axes[1],
        [f"TPOT {t * 1e3:.0f} ms" for t in targets],
        {
            platform: [r.get("tokens_per_s_per_npu", 0.0) for r in rows]
            for platform, rows in slo.items()
        },
        ylabel="decode tokens/s per NPU (0: not met)",
        title="SLO-driven operating points, 4096/256",
        value_format="%.0f",
    )
    mt = figures["multi_turn"]
    for key, style, label in (("ems", "-o", "EMS on"), ("no_ems", "--s", "EMS off")):
        ttft = mt[key]["ttft_p50_s_by_turn"]
        axes[2].plot(range(1, len(ttft) + 1), [t * 1e3 for t in ttft], style, label=label)
    axes[2].set(
        xlabel="turn of the conversation",
        ylabel="TTFT p50 (ms)",
        title=f"multi-turn ({mt['conversations']} conversations)",
    )
    axes[2].legend(fontsize=8)


if __name__ == "__main__":
    show(collect())
