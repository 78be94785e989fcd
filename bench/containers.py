"""Containers benchmark (issue 22): `docker compose up` of the emulator through the local engine.

1. The image: `cmemu image build` (debootstrap, no registry) time and size (`--rebuild-base`
   measures a clean machine: debootstrap and import too; else the base is reused).
2. Each deployment (`--runs`, default cm384 per node, cm384 per device, cm384x2 per node):
   time from `docker compose up` to every container healthy (the engine's healthchecks) and to
   every server answering SERVING from the host; the memory of it all (each container's cgroup,
   plus the engine's own processes: dockerd, containerd, the shims, docker-proxy, by PSS); the
   CPU at idle over `--idle` seconds, healthchecks included (the containers' cgroups and the
   engine's processes); and the cost of one container, broken down (its emulator process, its
   shim, its published port's proxy, the engine's share).
   Targets on the 2-core, 24 GB machine: cm384 per node healthy in <= 60 s within <= 4 GB;
   per device (627 containers) healthy in <= 5 min within <= 20 GB, idle <= 30% of one core.

A deployment that does not come up (the machine cannot hold it) is reported with what it
reached; `--max-containers N` skips those larger than N. Heavy: run it once, on a quiet machine.

    python bench/containers.py                                   # the three runs
    python bench/containers.py --runs cm-mini:device --idle 20 --results /tmp/r   # the quickest
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmemu.emulator.runtime import composegen, image
from cmemu.emulator.runtime.docker import PROJECT_LABEL, DockerEngine, docker
from cmemu.emulator.runtime.launchmodes import Docker
from cmemu.emulator.runtime.logs import configure_logging
from cmemu.emulator.runtime.serve import Per
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

CGROUP_MEMORY = "/sys/fs/cgroup/memory/docker"
CGROUP_CPU = "/sys/fs/cgroup/cpuacct/docker"
ENGINE = ("dockerd", "containerd", "docker-proxy")
SHIM = "containerd-shim"
OCTET = 65  # 127.65.x.y: the benchmark's published addresses
TICKS = os.sysconf("SC_CLK_TCK")
HEALTHY_PHASE = (
    "every container healthy"  # the launcher's progress, emulator/runtime/enginelaunch.py
)


@dataclass
class Run:
    preset: str
    per: Per
    containers: int = 0
    healthy_s: float | None = None
    serving_s: float | None = None
    error: str = ""
    memory_mb: dict[str, float] = field(default_factory=dict)
    idle_cpu_pct: dict[str, float] = field(default_factory=dict)
    per_container_mb: dict[str, float] = field(default_factory=dict)
    cgroup_usage_mb: float = 0.0  # the containers' cgroups, page cache included
    fits: int = 0  # containers of this size the machine's available memory holds
    health_interval_s: int = 0


def _pss_mb(pid: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _processes() -> dict[str, list[str]]:
    """The engine's processes by name (dockerd, containerd, containerd-shim..., docker-proxy)."""
    out: dict[str, list[str]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        key = SHIM if comm.startswith(SHIM) else comm
        if key in (*ENGINE, SHIM):
            out.setdefault(key, []).append(pid)
    return out


def _cpu_ticks(pids: list[str]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except OSError:
            pass
    return total


def _container_pids(ids: list[str]) -> list[str]:
    """The processes inside the containers (the host sees them: one PID namespace above)."""
    pids: list[str] = []
    for cid in ids:
        for path in glob.glob(f"{CGROUP_MEMORY}/{cid}*/cgroup.procs"):
            pids += Path(path).read_text().split()
    return pids


def _available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cgroups(ids: list[str], root: str, leaf: str) -> int:
    total = 0
    for cid in ids:
        for path in glob.glob(f"{root}/{cid}*/{leaf}"):
            total += int(Path(path).read_text())
    return total


async def _container_ids(engine: DockerEngine) -> list[str]:
    label = f"label={PROJECT_LABEL}={engine.project}"
    return (await docker("ps", "-q", "--no-trunc", "--filter", label)).split()


async def measure(run: Run, idle_s: float, tmp: Path) -> Run:
    text, _ = composegen.generate(run.preset, run.per)
    run.containers = text.count("\n    command: ") + 1  # and the broker
    run.health_interval_s = composegen.device_health_interval_s(run.containers)
    phases: dict[str, float] = {}
    started = time.monotonic()

    def progress(what: str, done: int, total: int) -> None:
        phases.setdefault(what.split(" (", maxsplit=1)[0], time.monotonic() - started)

    options = LaunchOptions(
        preset=run.preset,
        mode=Docker(
            per=run.per,
            project=f"cmemu-bench-{os.getpid()}",
            engine_octet=OCTET,
            run_dir=tmp / f"{run.preset}-{run.per}",
        ),
        ready_timeout_s=1800.0,
        progress=progress,
    )
    try:
        async with Supernode.start(options) as sn:
            run.serving_s = time.monotonic() - started
            assert sn.engine is not None
            containers = await sn.engine.containers()
            run.healthy_s = phases.get(HEALTHY_PHASE, run.serving_s)
            ids = await _container_ids(sn.engine)
            procs = _processes()
            cpu0 = _cgroups(ids, CGROUP_CPU, "cpuacct.usage")
            eng0 = {k: _cpu_ticks(v) for k, v in procs.items()}
            await asyncio.sleep(idle_s)
            cpu1 = _cgroups(ids, CGROUP_CPU, "cpuacct.usage")
            eng1 = {k: _cpu_ticks(v) for k, v in procs.items()}
            run.idle_cpu_pct["containers"] = 100 * (cpu1 - cpu0) / 1e9 / idle_s
            for k, before in eng0.items():
                run.idle_cpu_pct[k] = 100 * (eng1[k] - before) / TICKS / idle_s
            inside = sum(_pss_mb(pid) for pid in _container_pids(ids))
            run.memory_mb["emulator processes (PSS)"] = inside
            run.cgroup_usage_mb = _cgroups(ids, CGROUP_MEMORY, "memory.usage_in_bytes") / 2**20
            for k, pids in procs.items():
                run.memory_mb[k] = sum(_pss_mb(p) for p in pids)
            n = max(1, len(containers))
            run.per_container_mb = {
                "emulator process (PSS)": inside / n,
                "shim": run.memory_mb.get(SHIM, 0.0) / n,
                "docker-proxy": run.memory_mb.get("docker-proxy", 0.0) / n,
                "engine share (dockerd, containerd)": (
                    run.memory_mb.get("dockerd", 0.0) + run.memory_mb.get("containerd", 0.0)
                )
                / n,
            }
            # what the rest of the machine could still hold, at this cost per container
            run.fits = n + int(_available_mb() / max(1.0, _total(run.per_container_mb)))
    except Exception as exc:  # the machine could not hold it: say what happened
        run.error = f"{type(exc).__name__}: {exc}"[:500]
    return run


def _total(d: dict[str, float]) -> float:
    return sum(d.values())


def report(runs: list[Run], built: dict[str, Any], results: Path) -> None:
    print(f"image_build_s      {built['seconds']:.1f} ({built['source']}; {built['steps']})")
    print(f"image_size_mb      {built['size_mb']:.0f}")
    for r in runs:
        name = f"{r.preset}_per_{r.per}"
        if r.error and r.serving_s is None:
            print(f"{name:<26} FAILED: {r.error}")
            continue
        if r.error:
            print(f"{name:<26} (measured; then at the stop: {r.error[:200]})")
        print(
            f"{name:<26} {r.containers} containers: all healthy in {r.healthy_s:.1f} s, all "
            f"SERVING in {r.serving_s:.1f} s; "
            f"memory {_total(r.memory_mb):,.0f} MB in all; idle CPU "
            f"{_total(r.idle_cpu_pct):.1f}% of a core (healthchecks every "
            f"{r.health_interval_s} s); one container "
            f"{_total(r.per_container_mb):.1f} MB "
            f"({', '.join(f'{k} {v:.1f}' for k, v in r.per_container_mb.items())}); "
            f"cgroups {r.cgroup_usage_mb:,.0f} MB with page cache; the machine's available "
            f"memory holds about {r.fits} such containers"
        )
    ok = [r for r in runs if r.serving_s is not None]
    with outputs.figure(results, "containers", ncols=3) as (start, mem, cpu):
        labels = [f"{r.preset}\nper {r.per}\n({r.containers})" for r in ok]
        outputs.bars(start, labels, {"up to all healthy (s)": [r.serving_s or 0 for r in ok]},
                     title="docker compose up", ylabel="s")  # fmt: skip
        outputs.bars(mem, labels, {"total (MB)": [_total(r.memory_mb) for r in ok]},
                     title="memory: cgroups + engine PSS", ylabel="MB")  # fmt: skip
        outputs.bars(cpu, labels, {"idle (% of a core)": [_total(r.idle_cpu_pct) for r in ok]},
                     title="CPU at idle, healthchecks included", ylabel="%")  # fmt: skip
    outputs.write_json(results, "containers", {"image": built, "runs": runs})
    outputs.announce(results, "containers")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        default=["cm384:node", "cm384:device", "cm384x2:node"],
        metavar="PRESET:PER",
    )
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle measured")
    parser.add_argument("--max-containers", type=int, default=10_000)
    parser.add_argument("--rebuild-base", action="store_true", help="debootstrap again")
    parser.add_argument("--no-build", action="store_true", help="measure the image as it is")
    outputs.add_option(parser)
    args = parser.parse_args()
    configure_logging("warning")
    project = image.find_project()
    if args.no_build:
        built = {"seconds": 0.0, "source": "as built", "steps": {}}
    else:
        result = image.build(
            image.BuildOptions(
                source="debootstrap",
                project=project,
                cache_dir=image.default_cache_dir(),
                rebuild_base=args.rebuild_base,
            ),
            say=lambda line: print(f"image: {line}", flush=True),
        )
        built = {"seconds": result.seconds, "source": result.source, "steps": result.steps}
    built["size_mb"] = image.image_size(image.IMAGE) / 1e6
    runs = []
    with tempfile.TemporaryDirectory(prefix="cmemu-bench-") as tmp:
        for spec in args.runs:
            preset, _, per = spec.partition(":")
            run = Run(preset=preset, per="node" if per == "node" else "device")
            text, _ = composegen.generate(run.preset, run.per)
            if text.count("\n    command: ") + 1 > args.max_containers:
                run.error = f"skipped: more than --max-containers {args.max_containers}"
                runs.append(run)
                continue
            print(f"{spec}: docker compose up ...", flush=True)
            runs.append(asyncio.run(measure(run, args.idle, Path(tmp))))
    report(runs, built, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
