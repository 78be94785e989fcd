"""`cmemu up`, `cmemu serve` and `cmemu compose`: options in, the typed launch API called, the
startup summary printed. Everything that runs lives in emulator/runtime."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from pathlib import Path

from cmemu.emulator.cli import argtypes, progress, upmodes
from cmemu.emulator.cli.instances import check_not_running
from cmemu.emulator.cli.serve import stop_event as _stop_event
from cmemu.emulator.model.addressplans import (
    CONTAINER_PORT,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
)
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.presets import DEFAULT_PRESET
from cmemu.emulator.runtime import composegen, instance, metricserver, ports, state
from cmemu.emulator.runtime.image import IMAGE
from cmemu.emulator.runtime.procs import Running
from cmemu.emulator.runtime.security import Security
from cmemu.emulator.runtime.serve import (
    PER,
)
from cmemu.emulator.runtime.supernode import (
    ADDRESSING,
    MODES,
    LaunchOptions,
    StartInterrupted,
    Supernode,
)
from cmemu.emulator.runtime.webview import AUTO as UI_AUTO
from cmemu.emulator.runtime.webview import NONE as UI_NONE
from cmemu.emulator.runtime.webview import parse_address

DEFAULT_READY_TIMEOUT_S = 180.0


# --- up -------------------------------------------------------------------------------------


def summary(sn: Supernode, path: Path, seconds: float, ui: str | None = None) -> str:
    """What `cmemu up` prints once all is SERVING: where everything is and how to reach it."""
    topology = sn.topology
    every = [d for t in sn.supernodes for d in t.devices]
    kinds = {k: sum(d.kind.value == k for d in every) for k in ("npu", "cpu")}
    first = topology.devices[0]
    pools = len(every) - kinds["npu"] - kinds["cpu"]
    name = state.instance_name(path)
    which = "" if name == state.DEFAULT_NAME else f" --name {name}"
    what = (
        f"supernode {topology.supernode}"
        if len(sn.supernodes) == 1
        else f"{len(sn.supernodes)} supernodes ({', '.join(t.supernode for t in sn.supernodes)})"
    )
    lines = [
        f"cmemu: {what} ({topology.preset}, {sn.mode}) is up as "
        f"{name!r}: {kinds['npu']} NPUs, {kinds['cpu']} CPUs, {pools} memory pools, all "
        f"SERVING in {seconds:.2f} s (time_scale {topology.time_scale:g})",
        f"  state file  {path}",
    ]
    scheme = "https" if sn.security.tls is not None else "http"
    for t in sn.supernodes:
        lines += [
            f"  devices     {t.devices[0].address} ({t.devices[0].id}) to {t.devices[-1].address}",
            *(f"  {x.id:<11} {x.address}" for x in t.services),
            *(
                f"  {'openai':<11} {scheme}://{x.http_address}/v1  (the {x.id}'s OpenAI API)"
                for x in t.services
                if x.http_address
            ),
        ]
    lines += [
        f"  broker      {topology.broker or 'none (no MQTT)'}",
        f"  metrics     {metricserver.summary(metricserver.supernode_endpoints(sn))}",
        f"  web view    {ui or 'none (--ui none)'}",
        f"  probe       cmemu probe {first.address}",
        f"              grpcurl {_grpcurl_security(sn)}{first.address} list",
        f"  status      cmemu status{which}",
        f"  stop        cmemu down{which}   (or Ctrl-C / SIGTERM here)",
    ]
    if sn.engine is not None:
        lines.insert(
            2,
            f"  run dir     {sn.run_dir} (the engine's compose file; a container's log: "
            f"docker logs {sn.engine.project}_SERVICE_1)",
        )
    elif sn.run_dir is not None:
        lines.insert(2, f"  run dir     {sn.run_dir} (process logs in logs/)")
    if sn.security.token:
        lines.append(
            f"  token       {state.token_path(path)}: state-changing calls need "
            '-H "authorization: Bearer $(cat FILE)" (cmemu commands send it themselves)'
        )
    if sn.security.tls is not None:
        lines.append(f"  TLS CA      {sn.security.tls.ca}")
    return "\n".join(lines)


def _grpcurl_security(sn: Supernode) -> str:
    if sn.security.tls is None:
        return "-plaintext "
    return f"-cacert {sn.security.tls.ca} "


def _report_death(running: Running) -> None:
    print(
        f"cmemu: process {running.spec.name} (pid {running.proc.pid}) exited with code "
        f"{running.returncode}; not restarted (log: {running.log_path})",
        flush=True,
    )


def _loopback(text: str) -> int:
    try:
        return ports.loopback_prefix(text)
    except ports.BlockError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ui_address(text: str) -> str:
    if text == UI_NONE:
        return text
    try:
        parse_address(text)
    except EmulatorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


async def _up(
    options: LaunchOptions, path: Path, ui: str = UI_AUTO, block: ports.Block | None = None
) -> None:
    stop = _stop_event()
    started = time.perf_counter()
    boot = progress.BootBar() if progress.wanted() else None  # a terminal only: never in pipes
    if boot is not None:
        options = dataclasses.replace(options, progress=boot)
    try:
        async with instance.start(
            options, path, ui=ui, block=block, stop=stop, on_death=_report_death,
            argv=_argv_without_detach(),
        ) as hosted:  # fmt: skip
            if boot is not None:
                boot.close()
            sn = hosted.supernode
            print(summary(sn, path, time.perf_counter() - started, hosted.ui), flush=True)
            await stop.wait()
            print("cmemu: stopping (health NOT_SERVING, draining)", flush=True)
            if sn.died and sn.run_dir is not None:
                print(f"cmemu: logs of the processes that died are in {sn.run_dir}/logs")
    except StartInterrupted:
        print("cmemu: stopped while starting", flush=True)
    finally:
        if boot is not None:
            boot.close()


def _argv_without_detach() -> list[str]:
    return [a for a in sys.argv[1:] if a not in ("-d", "--detach")]


def cmd_up(args: argparse.Namespace) -> int:
    path = argtypes.resolve_state(args)
    assert path is not None
    check_not_running(path)  # before the port checks: a live instance is the likelier clash
    options = upmodes.launch_options(args, path)
    # every address the instance opens, in its block, each bound once now: a clash is one
    # message naming the holder before anything starts (issue 21, findings 12 and 15)
    try:
        block = ports.block_of(options, None if args.ui == UI_AUTO else args.ui)
    except ports.BlockError as exc:
        raise argtypes.UsageError(str(exc)) from None
    options = ports.with_block(options, block)
    ui = block.ui or args.ui
    if ui != UI_NONE:  # before anything starts: the rule of every server (issue 21)
        guard = Security(token=options.token, insecure=options.insecure).server()
        guard.check_bind("the web view", ui)
    ports.check_free(block)
    if args.detach:
        from cmemu.emulator.cli.detach import up_detached

        code: int = up_detached(_argv_without_detach(), path, args.ready_timeout + 30.0)
        return code
    asyncio.run(_up(options, path, ui, block))
    print("cmemu: stopped", flush=True)
    return 0


def add_preset_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        type=argtypes.preset,
        default=DEFAULT_PRESET,
        help=f"supernode preset (default {DEFAULT_PRESET}; see `cmemu presets`)",
    )


def add_topology_args(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p)
    p.add_argument(
        "--addressing",
        choices=ADDRESSING,
        default=None,
        help="ports: one host, a port per server (default in process); loopback: an address "
        "127.x.y.z per server on one port, as containers have (default for --mode procs; "
        "needed past ~11,000 devices)",
    )
    p.add_argument(
        "--port",
        type=argtypes.positive_int,
        default=CONTAINER_PORT,
        help=f"with --addressing loopback, the port of every server (default {CONTAINER_PORT})",
    )
    p.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address every server binds (default {DEFAULT_HOST})"
    )
    p.add_argument(
        "--base-port",
        type=argtypes.positive_int,
        default=DEFAULT_BASE_PORT,
        help=f"port of the first server; the others follow (default {DEFAULT_BASE_PORT})",
    )
    p.add_argument(
        "--time-scale",
        type=argtypes.positive_float,
        default=1.0,
        help="emulated seconds per wall second at most: time runs slower when the emulator "
        "cannot keep up (default 1; `cmemu status` shows the rate achieved)",
    )


def up_args(up: argparse.ArgumentParser) -> None:
    add_topology_args(up)
    # None when not given: a flag the chosen mode does not read is refused (upmodes.py)
    up.set_defaults(host=None, base_port=None, port=None)
    up.add_argument(
        "--loopback",
        type=_loopback,
        metavar="127.N",
        help="with --mode procs (or --addressing loopback): the instance's loopback addresses, "
        "127.N.x.y (default 127.10); another N keeps two procs instances on one host apart",
    )
    up.add_argument(
        "--no-dilation",
        dest="dilation",
        action="store_false",
        help="emulated time is wall time x --time-scale even when the emulator lags (a busy "
        "host then shows as late replies and missed heartbeats)",
    )
    argtypes.add_state_arg(up)
    up.add_argument(
        "-d",
        "--detach",
        action="store_true",
        help="return once all is SERVING and leave it running (stop it with `cmemu down`)",
    )
    up.add_argument(
        "--mode",
        choices=[m for m in MODES if m not in ("k8s", "docker")],
        help="inprocess: every server in this process (default); procs: one OS process per "
        "node (or --per device), each on its own loopback address; compose: `docker compose "
        "up` of the preset's compose file, one container per device (or --per node), "
        "through the Docker engine when one answers (--engine)",
    )
    up.add_argument(
        "--per",
        dest="per_container",
        choices=PER,
        help="with --mode procs (default node) or compose (default device)",
    )
    up.add_argument(
        "--engine",
        choices=["auto", "docker", "local"],
        help="with --mode compose (default auto) or --from-compose (default local): docker "
        "runs the containers through the Docker engine (it must answer); local runs their "
        "commands as local processes; auto: docker when an engine answers, else local",
    )
    up.add_argument(
        "--image",
        help=f"with the Docker engine: the emulator's image (default {IMAGE}; "
        "`cmemu image build` makes it)",
    )
    up.add_argument(
        "--from-compose",
        metavar="FILE",
        help="run the services of a compose file as local processes, each hostname becoming "
        "a loopback address",
    )
    up.add_argument(
        "--from-k8s",
        metavar="DIR",
        help="run the containers of Kubernetes manifests (`cmemu k8s -o DIR`) as local "
        "processes, each pod's names (its Services, hostname, aliases) a loopback address",
    )
    up.add_argument(
        "--ready-timeout",
        type=argtypes.seconds,
        default=DEFAULT_READY_TIMEOUT_S,
        help=f"seconds to wait for all SERVING (default {DEFAULT_READY_TIMEOUT_S:g})",
    )
    up.add_argument(
        "--broker",
        help="MQTT broker for telemetry and events, mqtt://HOST:PORT; 'none' for no MQTT "
        "(default: an embedded broker on the next-to-last port of the --base-port block, "
        "127.N.0.1 in procs mode, its URL in the state file; with "
        "--from-compose or --from-k8s, their own broker service, which this replaces)",
    )
    up.add_argument(
        "--metrics",
        choices=["on", "none"],
        default="on",
        help="on: every process serves Prometheus metrics at http://ADDRESS/metrics (the "
        "addresses in the startup summary, the state file and `cmemu status`); none: no "
        "process does (a compose file's services keep theirs)",
    )
    up.add_argument(
        "--ui",
        type=_ui_address,
        default=UI_AUTO,
        metavar="ADDR|none",
        help="the live web view of the machine (heat map of every NPU die, links, faults, "
        "events) at http://ADDR/ (HOST:PORT; port 0: a free one); none: no web view "
        "(default: the last port of the --base-port block, 127.N.0.2 in procs mode; the URL "
        "is in the startup summary and `cmemu status`)",
    )
    up.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file holding the bearer token every state-changing RPC then needs "
        "(`authorization: Bearer TOKEN`); reads, health and reflection stay open. Client "
        "commands find it through the state file. Or a keys file (TOML, version = 1): its "
        "`admin` key is the token, its [tenants.NAME] the OpenAI endpoint's API keys",
    )
    up.add_argument(
        "--insecure",
        action="store_true",
        help="allow binding beyond loopback (--host 0.0.0.0) without --token-file",
    )
    up.add_argument(
        "--tls",
        choices=["auto"],
        help="auto: a CA and a server certificate for this run (NAME-tls/ beside the state "
        "file, named in it); servers speak TLS, clients verify with the CA",
    )
    up.add_argument("--tls-cert", metavar="PEM", help="TLS with this certificate (chain)")
    up.add_argument("--tls-key", metavar="PEM", help="the key of --tls-cert")
    up.add_argument(
        "--tls-ca", metavar="PEM", help="the CA clients verify --tls-cert with (default: itself)"
    )
    up.add_argument(
        "--drain",
        type=argtypes.non_negative_seconds,
        default=0.2,
        help="seconds between NOT_SERVING and stop (default 0.2)",
    )


# --- compose --------------------------------------------------------------------------------


def cmd_compose(args: argparse.Namespace) -> int:
    out = Path(args.output)
    for written in composegen.write(args.preset, args.per, out):
        print(f"wrote {written}")
    for written in composegen.write_secrets(out.parent):  # only when there is no token yet
        print(f"wrote {written} (a new random token; keep it out of version control)")
    return 0


def compose_args(p: argparse.ArgumentParser) -> None:
    add_preset_arg(p)
    p.add_argument(
        "--per",
        choices=PER,
        default="device",
        help="one container per device (default) or node",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="the compose file to write; the topology and broker config go beside it",
    )
