"""`cmemu up`'s flags to the typed launch options: which mode they choose (launchmodes.py) and
that mode's own options. A flag that the chosen mode does not read is a usage error (exit 2),
never silently dropped: `--per` in process, `--base-port` with loopback addresses, `--image`
without compose, an address flag on a mode whose files carry the addresses."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Literal

from cmemu.emulator.cli import argtypes
from cmemu.emulator.model.addressplans import (
    CONTAINER_PORT,
    DEFAULT_BASE_PORT,
    DEFAULT_HOST,
    PROCS_FIRST_OCTET,
    LoopbackPlan,
    PortPlan,
)
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.runtime import composegen, docker, state
from cmemu.emulator.runtime.image import IMAGE
from cmemu.emulator.runtime.launchmodes import Compose, Docker, InProcess, K8s, ModeOptions, Procs
from cmemu.emulator.runtime.security import read_keys
from cmemu.emulator.runtime.supernode import EMBEDDED, LaunchOptions
from cmemu.emulator.runtime.tls import TlsFiles

# the flags that place servers, as `cmemu up` spells them (argparse's dest, flag)
_PLACING = (("addressing", "--addressing"), ("host", "--host"), ("base_port", "--base-port"),
            ("port", "--port"), ("loopback", "--loopback"))  # fmt: skip
_ON_PORTS = ("host", "base_port")  # the flags of a PortPlan
_ON_LOOPBACK = ("port", "loopback")  # the flags of a LoopbackPlan


def _given(args: argparse.Namespace, *dests: str) -> list[str]:
    """The flags among `dests` the command line gave (their parser default is None)."""
    return [flag for dest, flag in _PLACING if dest in dests and getattr(args, dest) is not None]


def plan_of(
    args: argparse.Namespace, *, loopback_default: bool, strict: bool = True
) -> PortPlan | LoopbackPlan:
    """The address plan of --addressing, --host, --base-port, --port and --loopback; `strict`
    (`cmemu up`, whose parser leaves them None when not given): a flag of the other plan is a
    usage error. Unset flags take the defaults the help states."""
    addressing = getattr(args, "addressing", None)
    loopback = addressing == "loopback" or (addressing is None and loopback_default)
    if loopback:
        wrong = _given(args, *_ON_PORTS)
        if wrong and strict:
            raise argtypes.UsageError(
                f"{' and '.join(wrong)} go with ports addressing (in process by default), not "
                "with loopback addresses (--mode procs or --addressing loopback: --port, "
                "--loopback)"
            )
        octet = getattr(args, "loopback", None)
        return LoopbackPlan(
            port=CONTAINER_PORT if args.port is None else args.port,
            first_octet=PROCS_FIRST_OCTET if octet is None else octet,
        )
    if getattr(args, "loopback", None) is not None:
        raise argtypes.UsageError("--loopback goes with --mode procs or --addressing loopback")
    if args.port is not None and strict:
        raise argtypes.UsageError(
            "--port goes with loopback addresses (--mode procs or --addressing loopback); "
            "with ports, --base-port"
        )
    return PortPlan(
        host=DEFAULT_HOST if args.host is None else args.host,
        base_port=DEFAULT_BASE_PORT if args.base_port is None else args.base_port,
    )


def _refuse(args: argparse.Namespace, what: str, *dests: str) -> None:
    """A usage error naming the flags of `dests` given for a mode (`what`) that reads none."""
    given = _given(args, *dests)
    if "per_container" in dests and args.per_container is not None:
        given.append("--per")
    if "image" in dests and args.image is not None:
        given.append("--image")
    if given:
        raise argtypes.UsageError(f"{', '.join(given)}: not read by {what}")


def mode_of(args: argparse.Namespace, run_dir: Path, project: str) -> ModeOptions:
    """The mode `cmemu up`'s flags choose, with its options."""
    if args.from_compose and args.from_k8s:
        raise argtypes.UsageError("--from-compose or --from-k8s: one of them")
    composing = bool(args.from_compose) or args.mode == "compose"
    if args.engine and not composing:
        raise argtypes.UsageError("--engine goes with --mode compose or --from-compose")
    if args.image is not None and (not composing or args.engine == "local"):
        raise argtypes.UsageError(
            "--image goes with the Docker engine: --mode compose or --from-compose (not "
            "--engine local)"
        )
    placing = tuple(dest for dest, _ in _PLACING)
    if args.from_k8s:
        if args.mode is not None:
            raise argtypes.UsageError("--from-k8s runs the manifests' containers: no --mode")
        _refuse(args, "--from-k8s (the manifests give the addresses)", *placing, "per_container")
        return K8s(manifests=Path(args.from_k8s), run_dir=run_dir)
    if composing:
        if args.mode not in (None, "compose"):
            raise argtypes.UsageError(f"--from-compose goes with --mode compose, not {args.mode}")
        given = args.from_compose is not None
        _refuse(
            args,
            "compose (the compose file gives the addresses)",
            *placing,
            *(("per_container",) if given else ()),
        )
        return _compose_mode(args, run_dir, project)
    if args.mode == "procs":
        plan = plan_of(args, loopback_default=True)
        return Procs(per=args.per_container or "node", plan=plan, run_dir=run_dir)
    _refuse(args, "in-process mode (one process: --mode procs has --per)", "per_container")
    return InProcess(plan=plan_of(args, loopback_default=False))


def _compose_mode(args: argparse.Namespace, run_dir: Path, project: str) -> Compose | Docker:
    """`--mode compose [--from-compose FILE]` and `--from-compose FILE`: through the Docker
    engine when one answers (`--engine auto`, the default of --mode compose) or when told
    (`--engine docker`); else the file's services as local processes (the default of
    --from-compose alone), said so."""
    given = Path(args.from_compose) if args.from_compose else None
    engine = args.engine or ("auto" if args.mode == "compose" else "local")
    if engine != "local":
        version = docker.engine_answers()
        if version is not None:
            print(f"cmemu: Docker engine {version}: docker compose up", flush=True)
            return Docker(
                compose_file=given,
                per=None if given is not None else args.per_container or "device",
                image=args.image or IMAGE,
                project=project,
                run_dir=run_dir,
            )
        if engine == "docker":
            raise EmulatorError(
                "no Docker engine answers (`docker version` failed): start dockerd, or pass "
                "--engine local to run the compose services as local processes"
            )
        print(
            "cmemu: no Docker engine answers: running the compose file's services as local "
            "processes (as --from-compose; --engine docker insists on an engine)",
            flush=True,
        )
    if given is not None:
        return Compose(file=given, run_dir=run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / f"{args.preset}.yaml"
    composegen.write(args.preset, args.per_container or "device", out, args.time_scale)
    composegen.write_secrets(run_dir)
    return Compose(file=out, run_dir=run_dir)


def launch_options(args: argparse.Namespace, path: Path) -> LaunchOptions:
    """The typed options of `cmemu up ARGS` for the instance whose state file is `path`."""
    keys = read_keys(Path(args.token_file)) if args.token_file else None
    # beside the state file, one per launcher: logs, the topology document, EMS's SSD
    run_dir = path.parent / f"{path.stem}-run-{os.getpid()}"
    mode = mode_of(args, run_dir, project=f"cmemu-{state.instance_name(path)}")
    return LaunchOptions(
        preset=args.preset,
        mode=mode,
        time_scale=args.time_scale,
        dilation=args.dilation,
        broker=args.broker or EMBEDDED,
        drain_s=args.drain,
        ready_timeout_s=args.ready_timeout,
        token=keys.admin if keys is not None else None,
        keys=keys,
        insecure=args.insecure,
        tls=_tls(args),
        tls_dir=state.tls_dir(path) if args.tls == "auto" else None,
        metrics=args.metrics != "none",
    )


def _tls(args: argparse.Namespace) -> TlsFiles | Literal["auto"] | None:
    if args.tls == "auto":
        if args.tls_cert or args.tls_key:
            raise argtypes.UsageError("--tls auto makes its own certificate: no --tls-cert/key")
        return "auto"
    if bool(args.tls_cert) != bool(args.tls_key):
        raise argtypes.UsageError("--tls-cert and --tls-key go together")
    if not args.tls_cert:
        if args.tls_ca:
            raise argtypes.UsageError("--tls-ca goes with --tls-cert and --tls-key")
        return None
    cert = Path(args.tls_cert).resolve()
    ca = Path(args.tls_ca).resolve() if args.tls_ca else cert
    return TlsFiles(cert=cert, key=Path(args.tls_key).resolve(), ca=ca)
