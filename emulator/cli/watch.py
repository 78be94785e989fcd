"""`cmemu watch`: the running emulator's events (and, if asked, telemetry) as they happen."""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import time
from typing import Any

import aiomqtt

from cmemu.emulator.cli.argtypes import non_negative_int
from cmemu.emulator.model.errors import InvalidArgumentError, UnavailableError
from cmemu.emulator.runtime import state
from cmemu.emulator.runtime.events import parse_broker_url, subscriber, topic


def _line(payload: dict[str, Any], stream: str) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(payload.get("wall", time.time())))
    device = payload.get("device", "?")
    if stream == "telemetry":
        keys = ("memory_used_bytes", "ub_tx_count", "ub_rx_count", "utilization", "faulted")
        detail = " ".join(f"{k}={payload[k]}" for k in keys if k in payload)
        return f"{stamp} {device:<14} telemetry {detail}"
    skip = {"device", "event", "wall", "emulated_ns"}
    detail = " ".join(f"{k}={v}" for k, v in payload.items() if k not in skip)
    return f"{stamp} {device:<14} {payload.get('event', '?'):<10} {detail}"


async def _watch(args: argparse.Namespace) -> int:
    path = state.path_from(args.state_file)
    docs = state.read_supernodes(path)
    login = state.mqtt_login(path)  # the embedded broker wants a login with a token
    topology, supernodes = docs[0], [t.supernode for t in docs]
    if not topology.broker:
        raise InvalidArgumentError(
            "the running emulator publishes no events (started with --broker none)"
        )
    host, port = parse_broker_url(topology.broker)
    streams = ["events", "telemetry"] if args.telemetry else ["events"]
    seen = 0
    try:
        async with subscriber(host, port, timeout=5, **login) as client:
            for stream in streams:  # every supernode's of the launch: they share its broker
                for supernode in supernodes:
                    await client.subscribe(topic(supernode, "+", stream), qos=1)
            if args.ready:
                print("watching", flush=True)
            async for message in client.messages:
                device = str(message.topic).split("/")[2]
                if not fnmatch.fnmatchcase(device, args.device):
                    continue
                raw = message.payload
                text = raw.decode() if isinstance(raw, bytes | bytearray) else str(raw)
                stream = str(message.topic).rsplit("/", 1)[1]
                print(text if args.json else _line(json.loads(text), stream), flush=True)
                seen += 1
                if args.count and seen >= args.count:
                    return 0
    except aiomqtt.MqttError as exc:
        raise UnavailableError(f"broker {topology.broker}: {exc}") from exc
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_watch(args))
    except KeyboardInterrupt:
        return 0


def watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="*", help="only devices matching this glob, e.g. 'n07-*'")
    p.add_argument("--telemetry", action="store_true", help="telemetry samples too")
    p.add_argument(
        "--count", type=non_negative_int, default=0, help="stop after N messages (0: never)"
    )
    p.add_argument("--json", action="store_true", help="the raw JSON payloads, one per line")
    p.add_argument("--ready", action="store_true", help="print 'watching' once subscribed")
