"""`cmemu up` in its three modes, `cmemu serve` (one container's entry point) and `cmemu compose`.

Every mode consumes one topology document; they differ only in where the servers run:
- inprocess: every server in this process (the embedded default);
- procs: one OS process per device or per node, plus the fabric, each `cmemu serve`;
- from-compose: exactly the services of a compose file, as local processes.
All of them write the state file once everything answers SERVING, and stop cleanly on a signal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from emulator.client import health
from emulator.model.errors import InvalidArgumentError, NotFoundError
from emulator.model.topology import ServiceKind, Topology
from emulator.runtime import compose, state
from emulator.runtime.broker import Broker
from emulator.runtime.events import parse_broker_url
from emulator.runtime.inprocess import InProcessSupernode
from emulator.runtime.procs import ProcSpec, Running, Supervisor

EPOCH_ENV = "CMEMU_EPOCH"
BROKER_ENV = "CMEMU_BROKER"
SSD_ENV = "CMEMU_EMS_SSD"
EMBEDDED_BROKER_HOST = "127.0.0.1"
CMEMU = str(Path(sys.executable).parent / "cmemu")


def summary(topology: Topology, path: Path, seconds: float, mode: str) -> str:
    counts = Counter(d.kind.value for d in topology.devices)
    first = topology.devices[0]
    return "\n".join(
        [
            f"cmemu: supernode {topology.supernode} ({topology.preset}, {mode}) is up: "
            f"{counts['npu']} NPUs, {counts['cpu']} CPUs, {counts['mempool']} memory pools, "
            f"all SERVING in {seconds:.2f} s (time_scale {topology.time_scale:g})",
            f"  state file  {path}",
            f"  devices     {first.address} ({first.id}) to {topology.devices[-1].address}",
            f"  fabric      {topology.service(ServiceKind.FABRIC).address}",
            f"  probe       cmemu probe {first.address}",
            f"              grpcurl -plaintext {first.address} list",
            f"              grpcurl -plaintext {first.address} cmemu.v1.Device/GetInfo",
            "  list        cmemu ls"
            + ("" if path == state.default_path() else f" --state-file {path}"),
            "Ctrl-C (or SIGTERM) stops it.",
        ]
    )


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve_until_signal(
    topology: Topology, path: Path, mode: str, started: float, stop: asyncio.Event
) -> None:
    """Publish the running emulator in the state file, then wait for a signal."""
    await asyncio.to_thread(state.write, path, topology, mode=mode)
    print(summary(topology, path, time.perf_counter() - started, mode), flush=True)
    try:
        await stop.wait()
    finally:
        print("cmemu: stopping (health NOT_SERVING, draining)", flush=True)
        await asyncio.to_thread(state.remove_if_ours, path)


# --- inprocess ---------------------------------------------------------------------------------


async def _up_inprocess(args: argparse.Namespace, topology: Topology, path: Path) -> None:
    stop = _stop_event()
    started = time.perf_counter()
    # EMS's SSD tier lives as long as this process: its DRAM copies die with it anyway
    async with InProcessSupernode(topology, drain_s=args.drain) as supernode:
        await _serve_until_signal(supernode.topology, path, "inprocess", started, stop)


# --- procs -------------------------------------------------------------------------------------


def _serve_argv(topology_path: Path, *what: str) -> tuple[str, ...]:
    return (CMEMU, "--log-level", "warning", "serve", "--topology", str(topology_path), *what)


def proc_specs(topology: Topology, topology_path: Path, per: str) -> list[ProcSpec]:
    """One process for the fabric, one per device or one per node, then one for EMS."""
    fabric = topology.service(ServiceKind.FABRIC)
    specs = [
        ProcSpec(
            name=fabric.id,
            argv=_serve_argv(topology_path, "--service", fabric.id),
            addresses=(fabric.address,),
        )
    ]
    if per == "device":
        specs += [
            ProcSpec(
                name=d.id, argv=_serve_argv(topology_path, "--device", d.id), addresses=(d.address,)
            )
            for d in topology.devices
        ]
    else:
        specs += [
            ProcSpec(
                name=node,
                argv=_serve_argv(topology_path, "--node", node),
                addresses=tuple(d.address for d in topology.in_node(node)),
            )
            for node in topology.nodes
        ]
    ems = topology.service(ServiceKind.EMS)
    specs.append(
        ProcSpec(
            name=ems.id,
            argv=_serve_argv(
                topology_path,
                "--service",
                ems.id,
                "--ssd-dir",
                str(topology_path.parent / "ems-ssd"),
            ),
            addresses=(ems.address,),
        )
    )
    return specs


def _report_death(running: Running) -> None:
    print(
        f"cmemu: process {running.spec.name} (pid {running.proc.pid}) exited with code "
        f"{running.returncode}; not restarted (log: {running.log_path})",
        flush=True,
    )


async def _supervise(
    waves: list[list[ProcSpec]],
    *,
    topology: Topology,
    path: Path,
    run_dir: Path,
    mode: str,
    ready_timeout_s: float,
) -> None:
    stop = _stop_event()
    started = time.perf_counter()
    supervisors: list[Supervisor] = []
    try:
        for wave in waves:
            sup = Supervisor(wave, log_dir=run_dir / "logs", on_exit=_report_death)
            supervisors.append(sup)
            await sup.start()
            waiting = asyncio.ensure_future(
                health.wait_serving(
                    [a for spec in wave for a in spec.addresses],
                    timeout_s=ready_timeout_s,
                    still_starting=sup.check_alive,
                )
            )
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait((waiting, stopped), return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if stop.is_set():
                waiting.cancel()
                return
            waiting.result()
        await _serve_until_signal(topology, path, mode, started, stop)
    finally:
        await asyncio.gather(*(s.stop() for s in reversed(supervisors)))
        deaths = [r for s in supervisors for r in s.died]
        if deaths:  # their logs explain them: keep the run directory
            print(f"cmemu: logs of the processes that died are in {run_dir / 'logs'}", flush=True)
        else:
            await asyncio.to_thread(shutil.rmtree, run_dir, True)


def _run_dir(path: Path) -> Path:
    run_dir = path.parent / f"run-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


async def _up_procs(args: argparse.Namespace, topology: Topology, path: Path) -> None:
    run_dir = _run_dir(path)
    topology_path = run_dir / "topology.json"
    await asyncio.to_thread(topology_path.write_text, topology.to_json())
    specs = proc_specs(topology, topology_path, args.per)
    # the fabric first: devices hand it their first transaction as soon as they serve; EMS
    # last: it rebuilds its index from the memory pools
    await _supervise(
        [specs[:1], specs[1:-1], specs[-1:]],
        topology=topology,
        path=path,
        run_dir=run_dir,
        mode=f"procs per {args.per}",
        ready_timeout_s=args.ready_timeout,
    )


async def _up_compose(args: argparse.Namespace, path: Path) -> None:
    run_dir = _run_dir(path)
    env = {**os.environ, EPOCH_ENV: os.environ.get(EPOCH_ENV) or repr(time.time())}
    services, topology = await asyncio.to_thread(
        compose.load, Path(args.from_compose), env, run_dir
    )
    waves = [[s.spec for s in wave] for wave in compose.start_order(services)]
    await _supervise(
        waves,
        topology=topology,
        path=path,
        run_dir=run_dir,
        mode=f"compose {args.from_compose}",
        ready_timeout_s=args.ready_timeout,
    )


MODES: dict[str, Callable[[argparse.Namespace, Topology, Path], Coroutine[Any, Any, None]]] = {
    "inprocess": _up_inprocess,
    "procs": _up_procs,
}


@contextlib.asynccontextmanager
async def _with_broker(args: argparse.Namespace, topology: Topology) -> AsyncIterator[Topology]:
    """The topology with its broker: the one given, none, or an embedded one for the run."""
    if args.broker == "none":
        yield topology
    elif args.broker:
        parse_broker_url(args.broker)
        yield dataclasses.replace(topology, broker=args.broker)
    else:
        async with Broker(host=EMBEDDED_BROKER_HOST) as broker:
            yield dataclasses.replace(topology, broker=broker.url)


async def _up(args: argparse.Namespace, topology: Topology, path: Path) -> None:
    async with _with_broker(args, topology) as with_broker:
        await MODES[args.mode](args, with_broker, path)


def cmd_up(args: argparse.Namespace, topology_for: Callable[[argparse.Namespace], Topology]) -> int:
    path = state.path_from(args.state_file)
    if args.from_compose:
        asyncio.run(_up_compose(args, path))
    else:
        if args.mode == "procs" and args.addressing == "ports":
            args.addressing = (
                "loopback"  # each process-mode device owns an address, as in a container
            )
        topology = topology_for(args)
        if args.mode == "procs":
            topology = dataclasses.replace(topology, epoch_wall_s=time.time())
        asyncio.run(_up(args, topology, path))
    print("cmemu: stopped", flush=True)
    return 0


# --- serve -------------------------------------------------------------------------------------


def _hosted(topology: Topology, args: argparse.Namespace) -> list[str]:
    if args.device:
        return [topology.device(args.device).id]
    if args.node:
        devices = topology.in_node(args.node)
        if not devices:
            raise NotFoundError(
                f"no node {args.node!r}; nodes are {topology.nodes[0]}..{topology.nodes[-1]}"
            )
        return [d.id for d in devices]
    kinds = {x.id for x in topology.services}
    if args.service not in kinds:
        raise NotFoundError(f"no service {args.service!r}; services: {', '.join(sorted(kinds))}")
    return [args.service]


async def _serve(args: argparse.Namespace) -> None:
    try:
        text = await asyncio.to_thread(Path(args.topology).read_text)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read topology {args.topology}: {exc}") from exc
    topology = Topology.from_json(text)
    if topology.epoch_wall_s is None:
        epoch = os.environ.get(EPOCH_ENV)
        if not epoch:
            raise InvalidArgumentError(
                f"the topology has no epoch and ${EPOCH_ENV} is unset: every process of one "
                "emulator must share the instant emulated time started"
            )
        try:
            topology = dataclasses.replace(topology, epoch_wall_s=float(epoch))
        except ValueError:
            raise InvalidArgumentError(
                f"${EPOCH_ENV}={epoch!r} is not a number of seconds"
            ) from None
    stop = _stop_event()
    broker = os.environ.get(BROKER_ENV) or topology.broker
    hosted = _hosted(topology, args)
    ssd = args.ssd_dir or os.environ.get(SSD_ENV)
    async with InProcessSupernode(
        topology,
        hosted=hosted,
        drain_s=args.drain,
        broker=broker,
        ems_ssd_dir=Path(ssd) if ssd else None,
        ems_rebuild_wait_s=args.rebuild_wait,
    ):
        await stop.wait()


def cmd_serve(args: argparse.Namespace) -> int:
    asyncio.run(_serve(args))
    return 0


# --- compose -----------------------------------------------------------------------------------


def cmd_compose(args: argparse.Namespace) -> int:
    for written in compose.write(args.preset, args.per, Path(args.output)):
        print(f"wrote {written}")
    return 0
