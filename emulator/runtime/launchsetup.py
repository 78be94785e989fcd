"""What every launcher sets up around its servers: the run's token and TLS files, the MQTT
broker (the one given, none, or an embedded one for the run) and the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from cmemu.emulator.model.address import join_address, parse_address
from cmemu.emulator.model.errors import bind_error
from cmemu.emulator.model.topology import Topology
from cmemu.emulator.runtime import tls
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.launchoptions import EMBEDDED, NO_BROKER, LaunchOptions
from cmemu.emulator.runtime.security import MQTT_USER, Security

EMBEDDED_BROKER_HOST = "127.0.0.1"


@contextlib.asynccontextmanager
async def broker_for(
    options: LaunchOptions, topology: Topology, security: Security
) -> AsyncIterator[Topology]:
    """The topology with its broker: the one given, none, or an embedded one for the run,
    which wants the run's login (`security.mqtt_login()`) when it has one."""
    if options.broker == NO_BROKER:
        yield topology
    elif options.broker != EMBEDDED:
        yield dataclasses.replace(topology, broker=options.broker)
    else:
        host, port = EMBEDDED_BROKER_HOST, 0
        if options.broker_address is not None:
            at = parse_address(options.broker_address, what="broker_address", any_port=True)
            host, port = at.host, at.port
        try:
            embedded = Broker(host=host, port=port, login=security.mqtt_login())
            await embedded.__aenter__()
        except OSError as exc:
            raise bind_error("the embedded broker", join_address(host, port), exc) from exc
        try:
            yield dataclasses.replace(topology, broker=embedded.url)
        finally:
            await embedded.__aexit__(None, None, None)


def servers_of(topology: Topology) -> list[tuple[str, str]]:
    """(id, address) of every server of a topology."""
    return [(d.id, d.address) for d in topology.devices] + [
        (x.id, x.address) for x in topology.services
    ]


@contextlib.asynccontextmanager
async def security_for(
    options: LaunchOptions, *supernodes: Topology, token: str | None = None
) -> AsyncIterator[Security]:
    """The run's token and TLS files. Binding beyond loopback without a token fails here,
    before anything starts; `tls="auto"` makes a CA and a certificate naming every address
    (removed at the end when in a temporary directory). With a token, the embedded broker
    wants user MQTT_USER with mqtt_password(token), and every client of it logs in."""
    servers = [server for topology in supernodes for server in servers_of(topology)]
    token = token or options.token
    keys = options.keys if options.keys is not None and options.keys.admin == token else None
    guard = Security(token=token, insecure=options.insecure).server()
    for server_id, address in servers:
        guard.check_bind(server_id, address)
    # a broker of the user's own is not given the token: it may not be ours to trust
    mqtt_user = MQTT_USER if token and options.broker == EMBEDDED else None
    if options.tls != "auto":
        yield Security(
            token=token, keys=keys, tls=options.tls, insecure=options.insecure, mqtt_user=mqtt_user
        )
        return
    with contextlib.ExitStack() as stack:
        directory = options.tls_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="cmemu-tls-"))
        )
        files = await asyncio.to_thread(
            tls.make_auto, directory, tls.hosts_of(a for _, a in servers)
        )
        yield Security(
            token=token, keys=keys, tls=files, insecure=options.insecure, mqtt_user=mqtt_user
        )


async def make_run_dir(run_dir: Path | None) -> Path:
    """The mode's run directory, made; a temporary one when it names none."""
    if run_dir is None:
        return Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="cmemu-run-"))
    await asyncio.to_thread(run_dir.mkdir, parents=True, exist_ok=True)
    return run_dir
