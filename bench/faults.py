"""What the fault catalogue costs on cm384 in one process (time scale 10).

    .venv/bin/python bench/faults.py
    .venv/bin/python bench/faults.py --rounds 5 --time-scale 20

For every kind that works in-process, on cm384: the wall time to inject one fault and to clear
it again through the public gRPC API (the client's KINDS table, as `cmemu fault` and the chaos
runner use it), and the wall time of a full fault listing (`cmemu fault ls`) with every kind
active at once. Then the hot-path cost of the fault gates (crash/hang/die/poison checks on
every call): kernels per second on a healthy NPU while faults of every kind are active
elsewhere, against none. Prints a table, writes bench/results/faults.json and faults.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from cmemu.emulator.client import faults
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.testing import calls_per_second, running_supernode
from cmemu.v1 import npu_pb2

RESULTS = Path(__file__).parent / "results"
KERNEL = npu_pb2.Kernel(flops=1e6, precision=npu_pb2.PRECISION_BF16)

CASES: list[tuple[str, str, dict[str, str]]] = [
    ("crash", "n01-npu0", {}),
    ("hang", "n01-npu1", {}),
    ("slow", "n01-npu2", {"compute": "0.5", "link": "0.5"}),
    ("hbm-ecc", "n01-npu3", {"offset": "0", "size": "4096"}),
    ("die-down", "n01-npu4", {"die": "1"}),
    ("device-down", "n01-npu5", {}),
    ("pool-loss", "n02-mem", {}),
    ("node-power-off", "n03", {}),
    ("link-flap", "n04-npu0.d0~n04-l1s0", {"period_s": "10", "duty": "0.5"}),
    ("link-down", "n04-npu1.d0~n04-l1s0", {}),
    ("switch-down", "n05-l1s3", {}),
]


async def _timed(call: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = await call
    return out, time.perf_counter() - start


async def run(rounds: int, scale: float, measure_s: float) -> dict[str, Any]:
    async with running_supernode("cm384", time_scale=scale) as sn:
        clients = Clients(sn.topology)
        npu = clients.npu("n00-npu0")
        await calls_per_second(lambda: npu.SubmitKernel(KERNEL), measure_s, 16)  # warm-up
        baseline = await calls_per_second(lambda: npu.SubmitKernel(KERNEL), measure_s, 16)
        kinds: dict[str, dict[str, float]] = {}
        for kind, target, params in CASES:
            adds, clears = [], []
            for _ in range(rounds):
                fault, add_s = await _timed(faults.inject(clients, kind, target, params))
                _, clear_s = await _timed(faults.clear(clients, fault.id))
                adds.append(add_s)
                clears.append(clear_s)
            kinds[kind] = {
                "inject_ms": 1e3 * statistics.median(adds),
                "clear_ms": 1e3 * statistics.median(clears),
            }
        active = [await faults.inject(clients, k, t, p) for k, t, p in CASES]
        listed, ls_s = await _timed(faults.list_all(clients))
        faulted = await calls_per_second(lambda: npu.SubmitKernel(KERNEL), measure_s, 16)
        for fault in active:
            await faults.clear(clients, fault.id)
        after = await calls_per_second(lambda: npu.SubmitKernel(KERNEL), measure_s, 16)
        await clients.close()
        return {
            "preset": "cm384",
            "time_scale": scale,
            "devices": len(sn.topology.devices),
            "kinds": kinds,
            "list_all_ms": 1e3 * ls_s,
            "faults_listed": len(listed),
            "kernels_per_s_no_faults": baseline,
            "kernels_per_s_all_kinds_active": faulted,
            "kernels_per_s_after_clearing": after,
        }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["kinds"])
    inject = [report["kinds"][k]["inject_ms"] for k in names]
    clear = [report["kinds"][k]["clear_ms"] for k in names]
    fig, ax = plt.subplots(figsize=(9, 4))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], inject, width=0.4, label="inject")
    ax.bar([i + 0.2 for i in x], clear, width=0.4, label="clear")
    ax.set_xticks(list(x), names, rotation=30, ha="right")
    ax.set_ylabel("wall ms (median)")
    ax.set_title(f"fault inject/clear on cm384, time scale {report['time_scale']:g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--measure-s", type=float, default=3.0)
    args = parser.parse_args()
    report = asyncio.run(run(args.rounds, args.time_scale, args.measure_s))
    print(f"cm384, {report['devices']} devices, time scale {report['time_scale']:g}")
    print(f"{'kind':<16}{'inject ms':>12}{'clear ms':>12}")
    for kind, row in report["kinds"].items():
        print(f"{kind:<16}{row['inject_ms']:>12.1f}{row['clear_ms']:>12.1f}")
    print(f"fault ls with {report['faults_listed']} active: {report['list_all_ms']:.1f} ms")
    print(
        f"kernels/s on a healthy NPU: {report['kernels_per_s_no_faults']:.0f} without faults, "
        f"{report['kernels_per_s_all_kinds_active']:.0f} with every kind active elsewhere, "
        f"{report['kernels_per_s_after_clearing']:.0f} after clearing them"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "faults.json").write_text(json.dumps(report, indent=2))
    plot(report, RESULTS / "faults.png")


if __name__ == "__main__":
    main()
