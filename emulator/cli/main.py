"""The `cmemu` command line: one sub-command table; each sub-command's module is imported only
when that command runs (`cmemu --help` and `cmemu status` do not pay for `cmemu up`'s imports).

Exit codes: 0 success; 1 an error the emulator reported (its message on stderr); 2 a usage error.
`cmemu probe` follows grpc_health_probe: 0 SERVING, 3 unreachable or failed call, 4 not SERVING.
Human output goes to stdout, JSON logs to stderr (client commands log only warnings by default);
output piped into a reader that stops early (`| head`) ends quietly with 141.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cmemu.emulator.cli.entry import version

USAGE_ERROR = 2
BROKEN_PIPE = 128 + 13  # as a process killed by SIGPIPE
SERVER_COMMANDS = frozenset({"up", "serve"})  # these log at info by default, the rest at warning
LEVELS = ("debug", "info", "warning", "error")  # emulator/runtime/logs.py's, spelled out here


@dataclass(frozen=True)
class Command:
    """A sub-command: its module, the function that runs it, the one that adds its arguments,
    and whether it takes the shared --name/--state-file (`state`: after its own arguments;
    `state_arg`: handed to its argument function)."""

    module: str
    run: str
    args: str | None
    help: str
    state: bool = False
    state_arg: bool = False


def _c(module: str, run: str, args: str | None, help: str, **how: bool) -> Command:
    return Command(f"cmemu.emulator.cli.{module}", run, args, help, **how)


SERVING_HELP = {  # emulator/cli/serving.py
    "serve-model": "deploy a model: NPUs, expert placement, weights via EMS",
    "deployments": "list the running emulator's model deployments",
    "undeploy": "stop a deployment and release its NPUs",
    "replay": "replay a Mooncake trace at the OpenAI endpoint: TTFT, TPOT, goodput",
}
COMMANDS: dict[str, Command] = {
    "up": _c("up", "cmd_up", "up_args",
             "run a whole supernode (in this process, as processes, or as containers)"),
    "serve": _c("serve", "cmd_serve", "serve_args",
                "serve one device, node or service of a topology (a container's entry point)"),
    "compose": _c("up", "cmd_compose", "compose_args",
                  "generate a docker compose file for a preset"),
    "image": _c("image", "cmd_image", "image_args",
                "build the emulator's container image, with or without a registry"),
    "k8s": _c("k8s", "cmd_k8s", "k8s_args",
              "generate Kubernetes manifests for a preset (a directory to apply)"),
    "probe": _c("describe", "cmd_probe", "probe_args",
                "health-check one device (exit 0 only when SERVING)"),
    "ls": _c("describe", "cmd_ls", "ls_args",
             "list the running emulator's devices with their health"),
    "topology": _c("describe", "cmd_topology", "topology_args",
                   "describe a preset's topology (--json: the full document)"),
    "presets": _c("describe", "cmd_presets", None, "list the supernode presets"),
    "hardware": _c("describe", "cmd_hardware", None,
                   "list every hardware figure with its source"),
    "xfer": _c("fabric", "cmd_xfer", "xfer_args",
               "one UB transaction through the live fabric: emulated latency, bandwidth",
               state=True),
    "links": _c("fabric", "cmd_links", "links_args", "the fabric's busiest links", state=True),
    "watch": _c("watch", "cmd_watch", "watch_args",
                "print the running emulator's events as they happen", state=True),
    "ems": _c("ems", "cmd_ems", "ems_args",
              "the elastic memory store: put, get, ls, rm, exists, stat", state_arg=True),
    "sched": _c("sched", "cmd_sched", "sched_args",
                "the scheduler: alloc, release, ls, spares, replace, policies", state_arg=True),
    "rdma": _c("rdma", "cmd_rdma", "rdma_args",
               "the RDMA gateways: qp, write, read, send, stats, links, route, fault",
               state_arg=True),
    "simulate": _c("simulate", "cmd_simulate", "simulate_args",
                   "model mode: serving, calibration, a long training run"),
    "manager": _c("manager", "cmd_manager", "manager_args",
                  "the cluster manager: status, incidents, active or passive", state_arg=True),
    "train": _c("train", "cmd_train", "train_args", "training jobs: start, ls, get, stop",
                state_arg=True),
    "usage": _c("usage", "cmd_usage", "usage_args",
                "what each tenant of the OpenAI endpoint used (CSV, JSON: billing)",
                state_arg=True),
    "status": _c("status", "cmd_status", "status_args",
                 "one running instance at a glance: launcher, time, health, faults", state=True),
    "fault": _c("fault", "cmd_fault", "fault_args",
                "inject, list and clear device, fabric, process and container faults",
                state_arg=True),
    "chaos": _c("chaos", "cmd_chaos", "chaos_args",
                "run a chaos scenario and judge it; list fault kinds and scenarios",
                state_arg=True),
    "down": _c("instances", "cmd_down", "down_args",
               "stop a running instance (SIGTERM to its launcher, then wait)", state=True),
    "instances": _c("instances", "cmd_instances", "instances_args",
                    "list the instances that have a state file"),
    **{
        name: _c("serving", "run_command", "command_args", text, state=True)
        for name, text in SERVING_HELP.items()
    },
}  # fmt: skip


class _Version(argparse.Action):
    """argparse's version action, asking the package metadata only when --version is given:
    the lookup (importlib.metadata, a scan of the path) costs every other command 40 ms."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"cmemu {version()}")  # on stdout, as argparse's own version action prints it
        parser.exit()


def _add_state_arg(p: argparse.ArgumentParser) -> None:
    from cmemu.emulator.cli import argtypes

    argtypes.add_state_arg(p)


def _configure(name: str, p: argparse.ArgumentParser) -> None:
    """Import the command's module and give the parser its arguments and function."""
    command = COMMANDS[name]
    module = importlib.import_module(command.module)
    run: Callable[[argparse.Namespace], int] = getattr(module, command.run)
    p.set_defaults(func=run)
    if command.args is not None:
        add: Callable[..., None] = getattr(module, command.args)
        if command.state_arg:
            add(p, _add_state_arg)
        elif command.module.endswith(".serving"):
            add(p, name)
        else:
            add(p)
    if command.state:
        _add_state_arg(p)


def _chosen(argv: list[str]) -> str | None:
    """The sub-command named on the command line, if any (the first word not an option, or
    the value of --log-level)."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of the command `argv` names (all of them when argv is
    None: for documentation and tests)."""
    parser = argparse.ArgumentParser(prog="cmemu", description="CloudMatrix supernode emulator")
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        help="JSON logs on stderr at this level (default: info for up and serve, "
        "warning for every other command)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv) if argv is not None else None
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        if argv is None or name == chosen:
            _configure(name, p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    with _imports_kept(_chosen(args_in) in SERVER_COMMANDS):
        parser = build_parser(args_in)
    args = parser.parse_args(args_in)
    return _run(args)


@contextlib.contextmanager
def _imports_kept(server: bool) -> Iterator[None]:
    """For a server command: no cyclic collection while its modules are imported, and what the
    imports made frozen after (gc.freeze: the permanent generation). Modules, classes and their
    tables live as long as the process; a server process's later full collections would walk
    them again each time, and the import of `cmemu up`'s modules alone paid 0.03 s of such
    collections (its start pauses the collector as well: emulator/runtime/heap.py `starting`)."""
    if not server or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; errors become messages and exit codes."""
    from cmemu.emulator.cli import argtypes
    from cmemu.emulator.model.errors import EmulatorError
    from cmemu.emulator.runtime.logs import configure_logging
    from cmemu.services.rpc import code_name

    configure_logging(args.log_level or ("info" if args.command in SERVER_COMMANDS else "warning"))
    try:
        argtypes.resolve_state(args)
        code: int = args.func(args)
        sys.stdout.flush()
    except argtypes.UsageError as exc:
        print(f"cmemu {args.command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except EmulatorError as exc:  # raised here, or a server's status a typed client read back:
        # e.g. "NOT_FOUND (DEVICE_NOT_FOUND): no device ...", "UNAVAILABLE (PEER_UNREACHABLE): ..."
        status = code_name(exc)
        reason = f" ({exc.reason})" if exc.reason != status else ""
        print(f"cmemu {args.command}: {status}{reason}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`cmemu ls | head -1`): no traceback, nothing more to flush
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
