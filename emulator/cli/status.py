"""`cmemu status`: one instance at a glance, from its state file and a few concurrent calls.

The launcher (pid, mode, uptime), emulated time now, where its services are, how many servers
answer SERVING, and every active fault. A state file whose launcher is gone is reported as stale,
with a non-zero exit.

Status must not report its own slowness as the devices' health (issue 21 finding 16): the health
checks go at most CONCURRENCY at a time, one that times out is asked again with twice the time,
and a device that still does not answer is "no answer (status timed out)", counted apart from
NOT_SERVING (it answered: not serving) and unreachable (nothing listens). Exit 0 whenever the
instance runs, whatever its devices' health (the summary and --json say it); 1 when stale.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cmemu.emulator.cli import argtypes
from cmemu.emulator.client import faults as fault
from cmemu.emulator.client import health
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.fabric import FabricClient
from cmemu.emulator.client.status import status_of
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.runtime import state

STALE_EXIT = 1
CONCURRENCY = 32  # health checks in flight at once: hundreds of devices share their host
SHOWN = {  # how a check's outcome reads in the summary
    health.NO_ANSWER: "no answer (status timed out)",
    health.UNREACHABLE: "unreachable",
}


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{seconds:.1f}s"


async def _probe(instance: state.Instance, timeout_s: float) -> dict[str, Any]:
    servers = [
        a
        for t in instance.supernodes
        for a in [d.address for d in t.devices] + [x.address for x in t.services]
    ]
    clients = Clients(
        instance.topology, state.credentials(instance.path), supernodes=instance.supernodes
    )
    try:
        statuses, faults, clock = await asyncio.gather(
            health.survey(
                servers,
                timeout_s=timeout_s,
                concurrency=CONCURRENCY,
                credentials=clients.credentials,
            ),
            _faults(clients),
            _clock(clients, timeout_s),
        )
    finally:
        await clients.close()
    return {"statuses": statuses, **faults, "clock": clock}


async def _clock(clients: Clients, timeout_s: float) -> dict[str, Any] | None:
    """Where emulated time stands, as the fabric (its owner) says: the asked and the achieved
    scale, the rate now, the stalls cut out (None when the fabric does not answer)."""
    try:
        info = await FabricClient(clients).clock(deadline_s=timeout_s)
    except EmulatorError:
        return None
    return {
        "emulated_s": info.emulated_ns / 1e9,
        "rate": info.rate,
        "achieved_scale": info.achieved_scale,
        "longest_stall_s": info.longest_stall_s,
        "stalled_s": info.stalled_s,
        "slowest": info.slowest,
    }


async def _faults(clients: Clients) -> dict[str, Any]:
    """Active faults; the fabric's may be unknowable (it is down), which status says."""
    try:
        fabric: list[fault.ActiveFault] | None = await fault.fabric_faults(clients)
        fabric_error = ""
    except EmulatorError as exc:
        fabric, fabric_error = None, f"{status_of(exc).name}: {exc}"
    devices = await fault.device_faults(clients)
    return {"fabric_faults": fabric, "fabric_error": fabric_error, "device_faults": devices}


def report(instance: state.Instance, probed: dict[str, Any], now: float) -> dict[str, Any]:
    """Everything `cmemu status --json` prints, from the instance and what the calls found."""
    topology, launcher = instance.topology, instance.launcher
    statuses: dict[str, str] = probed["statuses"]
    started = launcher.started_wall_s or topology.epoch_wall_s
    clock = probed.get("clock") or {}
    emulated = clock.get("emulated_s")
    faults = [*(probed["fabric_faults"] or []), *probed["device_faults"]]
    supernodes = instance.supernodes or (topology,)
    devices = [d for t in supernodes for d in t.devices]
    services = [x for t in supernodes for x in t.services]
    names = {d.id: d.address for d in devices} | {x.id: x.address for x in services}
    scheme = "https" if launcher.extra.get(state.TLS_CA_KEY) else "http"
    return {
        "name": instance.name,
        "state_file": str(instance.path),
        "running": True,
        "pid": launcher.pid,
        "mode": launcher.mode,
        "started_wall_s": started,
        "uptime_s": now - started if started is not None else None,
        "run_dir": launcher.run_dir,
        "argv": list(launcher.argv),
        "supernode": topology.supernode,
        "supernodes": [t.supernode for t in supernodes],
        "preset": topology.preset,
        "time_scale": topology.time_scale,
        "emulated_s": emulated,
        "time_rate": clock.get("rate"),
        "achieved_scale": clock.get("achieved_scale"),
        "longest_stall_s": clock.get("longest_stall_s"),
        "time_slowed_by": clock.get("slowest") or None,
        "broker": topology.broker,
        "services": {x.id: x.address for x in services},
        "http": {x.id: f"{scheme}://{x.http_address}/v1" for x in services if x.http_address},
        "metrics": launcher.metrics,
        "ui": launcher.ui,
        "devices": len(devices),
        "devices_serving": sum(statuses[d.address] == "SERVING" for d in devices),
        # every outcome counted: SERVING, NOT_SERVING, UNREACHABLE, NO_ANSWER (status timed out)
        "devices_by_status": dict(Counter(statuses[d.address] for d in devices)),
        "services_serving": sum(statuses[x.address] == "SERVING" for x in services),
        "not_serving": {who: statuses[a] for who, a in names.items() if statuses[a] != "SERVING"},
        "faults": [vars(f) for f in faults],
        "fabric_faults_error": probed["fabric_error"] or None,
    }


def _print(r: dict[str, Any]) -> None:
    uptime = _duration(r["uptime_s"]) if r["uptime_s"] is not None else "?"
    started = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started_wall_s"]))
        if r["started_wall_s"]
        else "?"
    )
    emulated = f"{r['emulated_s']:.3f} s" if r["emulated_s"] is not None else "unknown"
    pace = f"time scale {r['time_scale']:g}"
    if r["time_rate"] is not None:
        pace += f" asked, {r['time_rate']:.3g} now, {r['achieved_scale']:.3g} achieved"
        if r["longest_stall_s"]:
            pace += f", longest stall {r['longest_stall_s']:.2f} s"
        if r["time_slowed_by"]:
            pace += f" (slowed by {r['time_slowed_by']})"
    rows = [
        ("instance", f"{r['name']} (state file {r['state_file']})"),
        ("launcher", f"pid {r['pid']}, {r['mode']}, up {uptime} (since {started})"),
        ("supernode", f"{', '.join(r['supernodes'])} ({r['preset']}), {r['devices']} devices"),
        ("time", f"emulated {emulated}, {pace}"),
        ("broker", r["broker"] or "none (no MQTT)"),
        *((sid, address) for sid, address in r["services"].items()),
        *((f"{sid} http", url) for sid, url in r["http"].items()),
        *_metrics_rows(r["metrics"]),
        ("web view", r["ui"] or "none"),
    ]
    if r["run_dir"]:
        rows.append(("run dir", r["run_dir"]))
    serving = f"{r['devices_serving']}/{r['devices']} SERVING"
    others = [(s, n) for s, n in sorted(r["devices_by_status"].items()) if s != "SERVING"]
    if others:
        serving += "; " + ", ".join(f"{n} {SHOWN.get(s, s)}" for s, n in others)
    rows.append(("devices", serving))
    not_serving = list(r["not_serving"].items())
    if not_serving:
        shown = ", ".join(f"{who} {SHOWN.get(s, s)}" for who, s in not_serving[:5])
        more = f" and {len(not_serving) - 5} more" if len(not_serving) > 5 else ""
        rows.append(("", f"not serving: {shown}{more}"))
    faults = r["faults"]
    rows.append(("faults", f"{len(faults)} active" if faults else "none"))
    if r["fabric_faults_error"]:
        rows.append(("", f"fabric faults unknown: {r['fabric_faults_error']}"))
    for label, value in rows:
        print(f"{label:<10} {value}")
    for f in faults:
        print(f"  {f['id']:<20} {f['kind']:<14} {f['target']:<34} {f['detail']}")


def _metrics_rows(urls: dict[str, str], shown: int = 4) -> list[tuple[str, str]]:
    """Each process's /metrics, or the first few and how many more (--json has them all)."""
    if not urls:
        return [("metrics", "none")]
    rows = [("metrics", f"{url}  ({name})") for name, url in list(urls.items())[:shown]]
    if len(urls) > shown:
        rows.append(("", f"and {len(urls) - shown} more (--json lists every process's)"))
    return rows


def cmd_status(args: argparse.Namespace) -> int:
    path = Path(args.state_file)
    instance = state.read_instance(path)
    if not instance.alive:
        message = (
            f"instance {instance.name!r} is not running: its launcher (pid "
            f"{instance.launcher.pid}) is gone, and its state file {path} is stale "
            f"(`cmemu down{state.name_option(instance.name)}` removes it)"
        )
        if args.json:
            print(
                json.dumps(
                    {
                        "name": instance.name,
                        "state_file": str(path),
                        "running": False,
                        "pid": instance.launcher.pid,
                        "stale": True,
                    }
                )
            )
        print(f"cmemu status: {message}", file=sys.stderr)
        return STALE_EXIT
    probed = asyncio.run(_probe(instance, args.timeout))
    result = report(instance, probed, time.time())
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


def status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=argtypes.seconds,
        default=2.0,
        help="per health check (default 2 s); one that times out is asked again with twice "
        "this, then shown as 'no answer (status timed out)', apart from NOT_SERVING and "
        "unreachable. Exit 0 while the instance runs, whatever its devices' health",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
