"""`cmemu serve-model`, `cmemu deployments`, `cmemu undeploy` and `cmemu replay`: serving models on
the running emulator, from the shell (the router's gRPC API and its OpenAI endpoint)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import yaml

from cmemu.emulator.cli import loading
from cmemu.emulator.cli.argtypes import UsageError, positive_float, positive_int
from cmemu.emulator.cli.output import Column, print_rows
from cmemu.emulator.client.clients import Clients
from cmemu.emulator.client.clock import followed_time
from cmemu.emulator.client.deployments import Deployment, DeploymentState
from cmemu.emulator.client.router import RouterClient
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.topology import ServiceKind, Topology
from cmemu.emulator.runtime import state

if TYPE_CHECKING:  # imported by `replay` alone: its HTTP client, the serving engine's model and
    # numpy cost every other command here (serve-model, deployments, undeploy) 0.2 CPU s
    from cmemu.emulator.client.replay import ReplayReport

T = TypeVar("T")


def _state(d: Deployment) -> str:
    return d.state.value if d.state is not None else "?"


async def _with_router(args: argparse.Namespace, call: Callable[[RouterClient], Awaitable[T]]) -> T:
    path = state.path_from(args.state_file)
    clients = state.clients(path)
    try:
        return await call(RouterClient(clients))
    finally:
        await clients.close()


def _prefill(text: str) -> tuple[int, int]:
    """`KxM`: K prefill instances of M NPUs each."""
    k, sep, m = text.lower().partition("x")
    try:
        instances, npus = int(k), int(m)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prefill wants KxM (e.g. 6x16), got {text!r}") from None
    if not sep or instances < 1 or npus < 1:
        raise argparse.ArgumentTypeError(f"--prefill wants KxM with K, M >= 1, got {text!r}")
    return instances, npus


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option wants KEY=VALUE, got {text!r}")
    return key, value


def _endpoint(topology: Topology) -> str:
    http = topology.service(ServiceKind.ROUTER).http_address
    return f"http://{http}/v1" if http else "-"


def _describe(d: Deployment, topology: Topology) -> None:
    print(f"deployment {d.name}: {d.model}, {_state(d)}, {d.npus} NPUs")
    if d.error:
        print(f"  error: {d.error}")
    for i in d.instances:
        e = i.experts
        npus = f"{i.npus[0]}..{i.npus[-1]}" if len(i.npus) > 1 else ",".join(i.npus)
        role = f" [{i.role}]" if d.pd is not None else ""  # dynamic PD: its role now
        print(
            f"  {i.id:<10} {len(i.npus):>3} NPUs ({npus}), {i.dies} dies, EP{e.ep}: "
            f"{e.slots_per_die} experts per die ({e.shared} shared, {e.routed} routed, "
            f"{e.redundant} redundant; {e.policy}, imbalance {e.imbalance:.3f}){role}"
        )
    if d.pd is not None:
        p = d.pd
        print(
            f"  dynamic PD ({p.policy}): {_split(d)} prefill:decode"
            f"{f', {p.switching_units} switching' if p.switching_units else ''}; "
            f"{len(p.switches)} switch{'es' if len(p.switches) != 1 else ''}"
        )
        for switch in p.switches:
            joined = f"joined {switch.joined_ns / 1e9:.1f} s" if switch.joined_ns else "switching"
            moved = ", ".join(switch.instances)
            print(f"    {switch.at_ns / 1e9:.1f} s: {moved} to {switch.to}, {joined}")
    w = d.weights
    if w.bytes:
        print(
            f"  weights {w.bytes / 1e9:.0f} GB from {w.source}: cold {w.cold_ns / 1e9:.0f} s, "
            f"from EMS {w.from_ems_ns / 1e9:.0f} s (emulated)"
        )
    print(f"  endpoint {_endpoint(topology)} (model {d.name!r})")


def _split(d: Deployment) -> str:
    return f"{d.pd.prefill_units}:{d.pd.decode_units}" if d.pd is not None else "-"


def _pd(d: Deployment) -> dict[str, object] | None:
    """Live dynamic PD's status as JSON (None when the deployment's split is fixed)."""
    if d.pd is None:
        return None
    p = d.pd
    return {
        "policy": p.policy,
        "prefill_units": p.prefill_units,
        "decode_units": p.decode_units,
        "switching_units": p.switching_units,
        "prefill_share": p.prefill_share,
        "switches": [
            {
                "at_ns": w.at_ns,
                "to": w.to,
                "instances": list(w.instances),
                "joined_ns": w.joined_ns,
            }
            for w in p.switches
        ],
    }


def cmd_serve_model(args: argparse.Namespace) -> int:
    spec_yaml = ""
    options: dict[str, str] = {}
    if args.deployment:
        try:
            spec_yaml = Path(args.deployment).read_text()
        except OSError as exc:
            raise UsageError(f"--deployment: {exc}") from exc
        if args.model or args.decode or args.prefill or args.option:
            raise UsageError("--deployment FILE replaces MODEL, --decode, --prefill, --option")
    else:
        if not args.model:
            raise UsageError("name a MODEL (e.g. deepseek-r1) or give --deployment FILE")
        for key, value in args.option or []:
            options[key] = value
        if args.placement:
            options["placement"] = args.placement
    topology = state.read(state.path_from(args.state_file))

    async def deploy(router: RouterClient) -> Deployment:
        started = await router.deploy(  # returns at once, LOADING: say how long
            args.deployment_name or "",
            model="" if args.deployment else args.model,
            spec_yaml=spec_yaml,
            decode_npus=0 if args.deployment else args.decode or 0,
            prefill=None if args.deployment else args.prefill,
            options=options,
            warm=args.warm,
        )
        for line in loading.advice(started, topology.time_scale, warm=args.warm):
            print(line, flush=True)
        if not args.wait:
            return started
        return await loading.wait_serving(
            router, started.name, topology.time_scale, lambda text: print(text, flush=True)
        )

    deployment = asyncio.run(_with_router(args, deploy))
    _describe(deployment, topology)
    return 0 if deployment.state is not DeploymentState.FAILED else 1


DEPLOYMENT_COLUMNS: list[Column] = [
    ("name", "NAME", "<16"),
    ("model", "MODEL", "<14"),
    ("state", "STATE", "<9"),
    ("npus", "NPUS", ">5"),
    ("split", "P:D", "<5"),
    ("instances", "INSTANCES", ""),
]


def cmd_deployments(args: argparse.Namespace) -> int:
    listed = asyncio.run(_with_router(args, lambda r: r.list()))
    rows = [
        {
            "name": d.name,
            "model": d.model,
            "state": _state(d),
            "npus": d.npus,
            "split": _split(d),
            "instances": ", ".join(f"{i.id}:{len(i.npus)}" for i in d.instances),
            "roles": {i.id: i.role for i in d.instances},
            "pd": _pd(d),
            "weights": d.weights.source,
            "error": d.error,
        }
        for d in listed
    ]
    print_rows(rows, DEPLOYMENT_COLUMNS, as_json=args.json)
    if not args.json:
        print(f"{len(rows)} deployment{'' if len(rows) == 1 else 's'}")
    return 0


def cmd_undeploy(args: argparse.Namespace) -> int:
    gone = asyncio.run(_with_router(args, lambda r: r.undeploy(args.deployment_name)))
    print(f"undeployed {gone.name}: {gone.npus} NPUs released")
    return 0


async def _replay(args: argparse.Namespace, text: str) -> ReplayReport:
    from cmemu.emulator.client.replay import replay, report
    from cmemu.emulator.model.serving.deployment import parse_deployment
    from cmemu.emulator.model.serving.workload import read_mooncake

    path = state.path_from(args.state_file)
    topology = state.read(path)
    block = DEFAULT_PROFILE.serving.block_tokens
    requests = read_mooncake(text.splitlines(), block_tokens=block)[: args.limit]
    model = args.model
    clients = Clients(topology, state.credentials(path))
    try:
        router = RouterClient(clients)
        if model is None:
            names = [d.name for d in await router.list()]
            if len(names) != 1:
                raise UsageError(f"name the deployment with --model (deployed: {names})")
            model = names[0]
        deployed = await router.get(model)
    finally:
        await clients.close()
    spec = parse_deployment(yaml.safe_load(deployed.spec_yaml))
    http = topology.service(ServiceKind.ROUTER).http_address
    credentials = state.credentials(path)
    scheme = "https" if credentials.ca_pem else "http"
    started = time.monotonic()
    async with followed_time(topology, credentials, name="replay") as keeper:
        outcomes = await replay(
            f"{scheme}://{http}",
            model,
            requests,
            clock=keeper.timeline,
            block=block,
            speed=args.speed,
            api_key=credentials.token,
            ca_pem=credentials.ca_pem,
        )
    return report(
        outcomes,
        ttft_target_s=spec.prefill.ttft_target_s,
        tpot_target_s=spec.decode.tpot_target_s,
        wall_s=time.monotonic() - started,
    )


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        text = Path(args.trace).read_text()
    except OSError as exc:
        raise UsageError(f"{args.trace}: {exc}") from exc
    result = asyncio.run(_replay(args, text))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0 if not result.failed else 1
    ms = 1e3
    print(
        f"{result.completed}/{result.requests} requests in {result.emulated_s:.2f} s emulated "
        f"({result.wall_s:.2f} s wall); {result.output_tokens} output tokens, "
        f"{result.tokens_per_s:.1f} tokens/s"
    )
    for label, p in (("TTFT", result.ttft_s), ("TPOT", result.tpot_s)):
        print(
            f"  {label} ms: mean {p.mean * ms:.1f}  p50 {p.p50 * ms:.1f}  p90 {p.p90 * ms:.1f}  "
            f"p99 {p.p99 * ms:.1f}"
        )
    print(
        f"  goodput {result.goodput_per_s:.2f} requests/s ({result.slo_attainment:.1%} within "
        f"the SLOs); prefix-cache hits {result.prefix_hit_rate:.1%} of prompt tokens"
    )
    for error in result.errors:
        print(f"  error: {error}")
    return 0 if not result.failed else 1


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve-model": cmd_serve_model,
    "deployments": cmd_deployments,
    "undeploy": cmd_undeploy,
    "replay": cmd_replay,
}  # the help of each: emulator/cli/main.py


def run_command(args: argparse.Namespace) -> int:
    return COMMANDS[args.command](args)


def command_args(p: argparse.ArgumentParser, name: str) -> None:
    """The arguments of serving sub-command `name` (main adds --name/--state-file)."""
    if name == "serve-model":
        _serve_model_args(p)
    elif name == "undeploy":
        p.add_argument("deployment_name", metavar="NAME")
    elif name == "deployments":
        p.add_argument("--json", action="store_true")
    elif name == "replay":
        _replay_args(p)


def _serve_model_args(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("model", nargs="?", help="the model, e.g. deepseek-r1")
    serve.add_argument(
        "--decode", type=positive_int, metavar="N", help="NPUs of the decode instance"
    )
    serve.add_argument(
        "--prefill", type=_prefill, metavar="KxM", help="K prefill instances of M NPUs"
    )
    serve.add_argument("--deployment", metavar="FILE", help="a deployment YAML instead")
    serve.add_argument(
        "--as",
        dest="deployment_name",
        metavar="NAME",
        help="the deployment's name (default: the model's), the endpoint's `model`",
    )
    serve.add_argument("--placement", help="expert placement policy: static, eplb, ideal")
    serve.add_argument(
        "--option", type=_option, action="append", metavar="KEY=VALUE",
        help="a deployment field, e.g. decode.max_batch_per_die=32 (repeatable)",
    )  # fmt: skip
    serve.add_argument(
        "--wait", action="store_true", help="return once the weights are loaded and it serves"
    )
    serve.add_argument(
        "--warm",
        action="store_true",
        help="a warm start: the weights are already in EMS (they load from there, not cold)",
    )


def _replay_args(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("trace", help="a Mooncake-format trace (JSON lines)")
    rp.add_argument("--model", help="the deployment to send to (default: the only one)")
    rp.add_argument(
        "--speed", type=positive_float, default=1.0, help="replay X times faster (default 1)"
    )
    rp.add_argument("--limit", type=positive_int, help="only the first N requests")
    rp.add_argument("--json", action="store_true", help="the report as JSON")
