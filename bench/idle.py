"""A healthy supernode left alone on a busy host must stay healthy: cm384 in one process, a model
deployed and answering, no fault injected, for `--minutes` of wall time beside a two-core CPU hog
(stress-ng --cpu 2). Counted: the manager's incidents, the NPUs the scheduler holds failed, the
requests that failed or timed out (one every `--every` wall seconds), and the pace (asked and
achieved time scale, the worst lateness any process reported, the longest stall cut out).
Before emulated time slowed for a lagging emulator, such a run ended with every device failed.

    python bench/idle.py                       # 30 minutes at time scale 20, hog on
    python bench/idle.py --minutes 2 --no-hog  # a quick look

Writes bench/results/idle.json and idle.png.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import fabric_pb2, manager_pb2, router_pb2, scheduler_pb2

try:
    from bench import outputs
except ImportError:  # run as a script: python bench/NAME.py
    import outputs  # type: ignore[import-not-found, no-redef]

DEPLOYMENT = Path(__file__).resolve().parents[1] / "examples" / "deployments" / "small.yaml"
REQUEST_TIMEOUT_S = 120.0


async def soak(minutes: float, scale: float, every_s: float, hog: bool) -> dict[str, Any]:
    spec = yaml.safe_load(DEPLOYMENT.read_text())
    spec["preset"] = "cm384"
    stress = None
    if hog:
        path = shutil.which("stress-ng")
        if path is None:
            raise SystemExit("stress-ng is not installed: apt-get install stress-ng")
        stress = subprocess.Popen([path, "--cpu", "2", "--quiet"])  # noqa: ASYNC220
    samples: list[dict[str, Any]] = []
    try:
        async with running_supernode("cm384", time_scale=scale) as sn:
            clients = sn.clients
            await clients.router().Deploy(
                router_pb2.DeployRequest(name="idle", spec_yaml=yaml.safe_dump(spec), wait=True)
            )
            url = f"http://{sn.topology.service(ServiceKind.ROUTER).http_address}/v1/completions"
            body = {"model": "idle", "prompt": "keep answering", "max_tokens": 8}
            timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
            start = time.monotonic()
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while time.monotonic() - start < minutes * 60:
                    t0 = time.monotonic()
                    try:
                        async with session.post(url, json=body) as response:
                            await response.read()
                            status = response.status
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        status = 0
                        print(f"request failed: {type(exc).__name__}", flush=True)
                    info = await clients.fabric().GetClock(fabric_pb2.GetClockRequest())
                    samples.append(
                        {
                            "wall_s": t0 - start,
                            "status": status,
                            "took_s": time.monotonic() - t0,
                            "rate": info.rate,
                            "emulated_s": info.emulated_ns / 1e9,
                        }
                    )
                    await asyncio.sleep(max(0.0, every_s - (time.monotonic() - t0)))
            wall = time.monotonic() - start
            found = await clients.manager().ListIncidents(manager_pb2.ListIncidentsRequest())
            allocs = await clients.scheduler().ListAllocations(
                scheduler_pb2.ListAllocationsRequest()
            )
            info = await clients.fabric().GetClock(fabric_pb2.GetClockRequest())
            deployed = await clients.router().GetDeployment(
                router_pb2.GetDeploymentRequest(name="idle")
            )
    finally:
        if stress is not None:
            stress.terminate()
            stress.wait(timeout=30)
    return {
        "minutes": minutes,
        "time_scale": scale,
        "hog": hog,
        "wall_s": wall,
        "incidents": len(found.incidents),
        "failed_npus": allocs.failed_npus,
        "requests": len(samples),
        "requests_failed": sum(s["status"] != 200 for s in samples),
        "deployment_state": router_pb2.DeploymentState.Name(deployed.state),
        "achieved_scale": info.achieved_scale,
        "worst_lag_emulated_s": info.worst_lag_emulated_s,
        "longest_stall_s": info.longest_stall_s,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=5.0, help="wall seconds between requests")
    parser.add_argument("--no-hog", dest="hog", action="store_false")
    outputs.add_option(parser)
    args = parser.parse_args()
    configure_logging("error")
    doc = asyncio.run(soak(args.minutes, args.time_scale, args.every, args.hog))
    print(
        f"cm384 x{doc['time_scale']:g}{' beside a 2-core hog' if doc['hog'] else ''} for "
        f"{doc['wall_s'] / 60:.1f} min: {doc['incidents']} incidents, {doc['failed_npus']} NPUs "
        f"failed, {doc['requests_failed']} of {doc['requests']} requests failed, deployment "
        f"{doc['deployment_state']}; achieved x{doc['achieved_scale']:.3g}, worst lag "
        f"{doc['worst_lag_emulated_s']:.3f} emulated s, longest stall "
        f"{doc['longest_stall_s']:.2f} s"
    )
    outputs.write_json(args.results, "idle", doc)
    with outputs.figure(args.results, "idle", ncols=2) as (rate_ax, took_ax):
        wall = [s["wall_s"] / 60 for s in doc["samples"]]
        outputs.over_time(
            rate_ax,
            wall,
            {"rate": [s["rate"] for s in doc["samples"]]},
            xlabel="wall minutes",
            ylabel="emulated s per wall s",
            title="the clock's rate",
            targets={"asked": doc["time_scale"]},
        )
        outputs.over_time(
            took_ax,
            wall,
            {"request": [s["took_s"] for s in doc["samples"]]},
            xlabel="wall minutes",
            ylabel="wall s",
            title="one 8-token completion",
            style=".",
        )
    outputs.announce(args.results, "idle")


if __name__ == "__main__":
    main()
