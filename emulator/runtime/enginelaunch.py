"""The launcher of mode "docker": a compose file (given, or generated for the preset) run by the
Docker engine (emulator/runtime/composeengine.py), yielded once every container is healthy and
every server answers SERVING from the host; `docker compose down -v` on exit, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.runtime import composeengine, composegen
from cmemu.emulator.runtime.composeengine import EngineRun
from cmemu.emulator.runtime.docker import DockerEngine
from cmemu.emulator.runtime.launchoptions import Docker, LaunchOptions, StartInterrupted, report
from cmemu.emulator.runtime.launchsetup import make_run_dir
from cmemu.emulator.runtime.procs import Running
from cmemu.emulator.runtime.security import MQTT_USER, Security, read_token
from cmemu.emulator.runtime.stopping import unless_stopped
from cmemu.emulator.runtime.supernode import Supernode

log = structlog.get_logger("cmemu.enginelaunch")
CREATE_S_PER_CONTAINER = 2.0


def compose_file_for(options: LaunchOptions, mode: Docker, run_dir: Path) -> Path:
    """The file the engine runs: the mode's own, or the preset's generated into the run dir
    (with its token and broker password)."""
    if mode.compose_file is not None:
        return mode.compose_file
    out = run_dir / f"{options.preset}.yaml"
    composegen.write(options.preset, mode.generated_per, out, options.time_scale)
    composegen.write_secrets(run_dir)
    return out


def token_of(compose_file: Path) -> str | None:
    """The token the compose file's secret holds (what state-changing calls present)."""
    path = compose_file.parent / composegen.TOKEN_FILE
    return read_token(path) if path.exists() else None


@contextlib.asynccontextmanager
async def launch(
    options: LaunchOptions,
    mode: Docker,
    stop: asyncio.Event,
    on_death: Callable[[Running], None] | None,
) -> AsyncIterator[Supernode]:
    version = await composeengine.require_engine()
    project = mode.project or f"cmemu-{os.getpid()}"  # Docker checked a given one
    run_dir = await make_run_dir(mode.run_dir)
    run: EngineRun | None = None
    engine = DockerEngine(project)
    try:
        compose_file = await asyncio.to_thread(compose_file_for, options, mode, run_dir)
        run = await asyncio.to_thread(
            composeengine.prepare,
            compose_file,
            run_dir,
            project=project,
            tag=mode.image,
            first_octet=mode.engine_octet,
        )
        engine = DockerEngine(project, servers=run.servers, networks=run.networks)
        token = await asyncio.to_thread(token_of, compose_file)
        # the compose broker's password file holds MQTT_USER with mqtt_password(token): the
        # host logs in
        security = Security(token=token, mqtt_user=MQTT_USER if token else None)
        credentials = security.credentials()
        total = len(run.servers)
        # hundreds of containers created one by one on a busy engine: at least 2 s each
        timeout_s = max(options.ready_timeout_s, CREATE_S_PER_CONTAINER * total)
        report(options, f"docker compose up ({total} containers, engine {version})", 0, total)
        log.info("compose up", project=project, file=str(run.file), containers=total)
        await _until_stopped(composeengine.up(run, timeout_s=timeout_s), stop)
        report(options, "waiting for every container to be healthy", 0, total)
        await _until_stopped(
            composeengine.wait_healthy(engine, expected=total, timeout_s=timeout_s),
            stop,
        )
        report(options, "every container healthy; asking every server", total, total)
        supernodes = await composeengine.with_epoch(run, credentials)
        run = dataclasses.replace(run, supernodes=supernodes)
        await _until_stopped(
            composeengine.serving(run, timeout_s=timeout_s, credentials=credentials),
            stop,
        )
        async with composeengine.watch_deaths(run, engine, security.mqtt_login()):
            yield Supernode(
                options=options,
                topology=supernodes[0],
                clients=Clients(supernodes[0], credentials, supernodes=supernodes),
                supernodes=supernodes,
                run_dir=run_dir,
                security=security,
                engine=engine,
            )
    finally:
        if run is not None:
            log.info("compose down", project=project)
            await asyncio.shield(composeengine.down(run, engine))
        await asyncio.to_thread(composeengine.remove_dir, run_dir)


async def _until_stopped(step: object, stop: asyncio.Event) -> None:
    """Await a start step unless the stop event comes first (StartInterrupted)."""
    assert asyncio.iscoroutine(step)
    if not await unless_stopped(step, stop):
        raise StartInterrupted("stopped while starting")
