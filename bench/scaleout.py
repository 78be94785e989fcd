"""Linearity of data-parallel training from 1 to 432 supernodes, in model mode.

A job on every NPU of every supernode: one supernode's step on the cost model (the UB link graph
of the base preset), the gradient all-reduce hierarchical (reduce-scatter inside over UB,
all-reduce of each shard across the supernodes over the RDMA plane, all-gather inside), the
cross-supernode phase in closed form (emulator/model/training/scaleout.py). For 1, 2, 8, 26
(9,984 NPUs: "10,000 cards"), 108 and 432 supernodes it prints the step time, its phases and the
linearity (throughput(N) / (N x throughput(1))), for each expert-parallel size, with the bucket
all-reduces overlapped with the backward pass and without, and with the plane's spine -> core
tier oversubscribed 1, 2 and 4 times. Then it times the cross-supernode phase flow by flow on
`<preset>x2` and `<preset>x4` (flowsim over the plane's links) against the closed form, and the
wall time of everything. Published: above 95% linearity at 10,000 cards (HARDWARE.md).

    python bench/scaleout.py [--preset cm384] [--expert-parallel 1,8,32] [--oversubscription 1,2,4]
    python bench/scaleout.py --quick --results /tmp/r   # the quickest: cm-mini, EP 1

Writes bench/results/scaleout.json and bench/results/scaleout.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.scaleout import build_cluster
from cmemu.emulator.model.training.scaleout import (
    CROSS_ALGORITHMS,
    ScaleOutStep,
    cross_allreduce,
    scaleout_step,
    supernode_step,
    time_cross_flows,
    with_oversubscription,
)

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

SUPERNODES = (1, 2, 8, 26, 108, 432)
VALIDATE = (2, 4)  # supernodes timed flow by flow
PUBLISHED = {"linearity": 0.95, "npus": 10_000}  # "above 95% linearity at 10,000 cards"


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text}") from None
    if not all(v >= 1 for v in values):
        raise argparse.ArgumentTypeError("oversubscription must be >= 1 (1: non-blocking)")
    return values


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not all(v >= 1 for v in values):
        raise argparse.ArgumentTypeError("expert-parallel sizes must be >= 1")
    return values


def _row(s: ScaleOutStep) -> dict[str, Any]:
    return dataclasses.asdict(s)


def series(preset: str, eps: list[int], oversubs: list[float]) -> tuple[list[Any], list[Any]]:
    """Every (EP, overlap, oversubscription) series over SUPERNODES, and each EP's supernode
    step (measured once: only the cross-supernode phase depends on N and the plane)."""
    found: list[dict[str, Any]] = []
    bases: list[dict[str, Any]] = []
    for ep in eps:
        started = time.perf_counter()
        base = supernode_step(preset, expert_parallel=ep)
        bases.append({**dataclasses.asdict(base), "wall_s": time.perf_counter() - started})
        for oversub in oversubs:
            profile = with_oversubscription(DEFAULT_PROFILE, spine=oversub)
            for overlap in (True, False):
                started = time.perf_counter()
                rows = [
                    _row(scaleout_step(base, n, overlap=overlap, profile=profile))
                    for n in SUPERNODES
                ]
                found.append(
                    {
                        "expert_parallel": base.expert_parallel,
                        "oversubscription": oversub,
                        "overlap": overlap,
                        "rows": rows,
                        "wall_s": time.perf_counter() - started,
                    }
                )
    return found, bases


def validate(
    preset: str, shard: float, counts: tuple[int, ...], oversubs: list[float]
) -> list[dict[str, Any]]:
    """The cross-supernode all-reduce flow by flow on `<preset>xN` against the closed form."""
    found = []
    for n in counts:
        for oversub in sorted({oversubs[0], oversubs[-1]}):
            profile = with_oversubscription(DEFAULT_PROFILE, spine=oversub)
            topology = build_cluster(f"{preset}x{n}", profile=profile)[0]
            for algorithm in CROSS_ALGORITHMS:
                started = time.perf_counter()
                flows = time_cross_flows(topology, shard, algorithm, profile)
                wall = time.perf_counter() - started
                closed = cross_allreduce(
                    n, shard, nodes=len(topology.nodes), algorithm=algorithm, profile=profile
                )
                found.append(
                    {
                        "supernodes": n,
                        "oversubscription": oversub,
                        "algorithm": algorithm,
                        "shard_bytes": shard,
                        "flowsim_s": flows.seconds,
                        "closed_form_s": closed.seconds,
                        "relative_error": flows.seconds / closed.seconds - 1,
                        "flows": flows.flows,
                        "rounds": flows.rounds,
                        "wall_s": wall,
                    }
                )
    return found


def report(all_series: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    head = all_series[0]
    print(
        f"EP {head['expert_parallel']}, spine oversubscription {head['oversubscription']:g}, "
        "bucket all-reduces overlapped with the backward pass"
    )
    print(
        f"{'SN':>4} {'NPUs':>7} {'algorithm':<17} {'step s':>8} {'compute':>8} {'RS ms':>7} "
        f"{'cross ms':>8} {'AG ms':>7} {'exposed':>8} {'linearity':>9}"
    )
    for r in head["rows"]:
        print(
            f"{r['supernodes']:>4} {r['npus']:>7} {r['algorithm'] or '-':<17} {r['step_s']:>8.3f} "
            f"{r['compute_s']:>8.3f} {r['reduce_scatter_s'] * 1e3:>7.3f} "
            f"{r['cross_s'] * 1e3:>8.3f} {r['all_gather_s'] * 1e3:>7.3f} "
            f"{r['exposed_s']:>8.3f} {r['linearity']:>8.2%}"
        )
    print("\nlinearity by supernodes (EP, spine oversubscription, overlap)")
    print(f"{'':<22}" + "".join(f"{n:>8}" for n in SUPERNODES))
    for s in all_series:
        label = (
            f"EP{s['expert_parallel']} x{s['oversubscription']:g} "
            f"{'overlap' if s['overlap'] else 'serial'}"
        )
        print(f"{label:<22}" + "".join(f"{r['linearity']:>8.2%}" for r in s["rows"]))
    print(
        f"published: above {PUBLISHED['linearity']:.0%} at {PUBLISHED['npus']:,} cards "
        f"(26 supernodes: {26 * head['rows'][0]['npus']:,} NPUs)"
    )
    print("\ncross-supernode all-reduce: flowsim on the plane's links vs the closed form")
    for c in checks:
        print(
            f"  {c['supernodes']} supernodes x{c['oversubscription']:g} {c['algorithm']:<17} "
            f"flowsim {c['flowsim_s'] * 1e3:.4f} ms, closed {c['closed_form_s'] * 1e3:.4f} ms, "
            f"error {c['relative_error']:+.2e} ({c['flows']} flows, {c['wall_s']:.2f} s wall)"
        )


def plot(all_series: list[dict[str, Any]], directory: Path) -> None:
    with outputs.figure(directory, "scaleout", ncols=2, size=(12, 4.5)) as (by_ep, by_over):
        first = all_series[0]["oversubscription"]
        eps = sorted({s["expert_parallel"] for s in all_series})
        overs = sorted({s["oversubscription"] for s in all_series})
        for s in all_series:
            npus = [r["npus"] for r in s["rows"]]
            pct = [100 * r["linearity"] for r in s["rows"]]
            style = "-o" if s["overlap"] else "--s"
            mode = "overlapped" if s["overlap"] else "serial"
            if s["oversubscription"] == first:  # a colour per EP, a line style per mode
                colour = f"C{eps.index(s['expert_parallel'])}"
                label = f"EP{s['expert_parallel']} {mode}"
                by_ep.plot(npus, pct, style, color=colour, label=label)
            if s["expert_parallel"] == all_series[0]["expert_parallel"]:
                colour = f"C{overs.index(s['oversubscription'])}"
                label = f"x{s['oversubscription']:g} {mode}"
                by_over.plot(npus, pct, style, color=colour, label=label)
        for ax, title in (
            (by_ep, f"by expert-parallel size (oversubscription x{first:g})"),
            (by_over, f"by spine oversubscription (EP{all_series[0]['expert_parallel']})"),
        ):
            ax.axhline(100 * PUBLISHED["linearity"], linestyle=":", color="k", label="95%")
            ax.axvline(PUBLISHED["npus"], linestyle=":", color="grey", label="10,000 cards")
            ax.set_xscale("log")
            ax.set(xlabel="NPUs", ylabel="linearity (%)", title=title)
            ax.legend(fontsize=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cm384", help="the supernode (default cm384)")
    parser.add_argument("--expert-parallel", type=_ints, default=[1, 8, 32], help="e.g. 1,8,32")
    parser.add_argument(
        "--oversubscription", type=_floats, default=[1.0, 2.0, 4.0], help="spine -> core, e.g. 1,2"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="cm-mini, EP 1, oversubscription 1 and 2, validated at 2 supernodes",
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.preset, args.expert_parallel, args.oversubscription = "cm-mini", [1], [1.0, 2.0]
    started = time.perf_counter()
    try:  # a preset that does not exist, an EP size that does not divide its dies
        all_series, bases = series(args.preset, args.expert_parallel, args.oversubscription)
    except EmulatorError as exc:
        parser.error(str(exc))
    modelled = time.perf_counter() - started
    first = bases[0]
    shard = first["bucket_bytes"] / first["dp"]
    checks = validate(
        args.preset, shard, VALIDATE[:1] if args.quick else VALIDATE, args.oversubscription
    )
    total = time.perf_counter() - started
    report(all_series, checks)
    print(
        f"\nwall: {modelled:.2f} s for {len(all_series) * len(SUPERNODES)} steps "
        f"(of which the supernode steps {sum(b['wall_s'] for b in bases):.2f} s), "
        f"{total - modelled:.2f} s of flow-by-flow validation, {total:.2f} s in all"
    )
    doc = {
        "preset": args.preset,
        "supernodes": SUPERNODES,
        "published": PUBLISHED,
        "supernode_steps": bases,
        "series": all_series,
        "validation": checks,
        "wall_s": {"model": modelled, "validation": total - modelled, "total": total},
    }
    outputs.write_json(args.results, "scaleout", doc)
    plot(all_series, args.results)
    outputs.announce(args.results, "scaleout")


if __name__ == "__main__":
    main()
