"""A supernode others can attach to by name (issue 18 item 5): the supernode, and the files that
let another process find it and act on it: the state file (its topology, the launcher's pid,
processes and containers for the process and container faults, metrics and web view URLs), the
token file, the TLS material `--tls auto` made; and a stop that always ends.

`cmemu up` is a skin over `start` (it adds the boot bar and the printed summary); a test or a
benchmark that wants `cmemu ls`, `cmemu fault` or `cmemu status` to find what it started calls
it too, with no CLI process in between. What attaches is the state file: `attach(name)` in
Python (attach.py: the topology, typed clients, the credentials, the launcher, a stop),
`--name`/`--state-file` on the command line.

A stop's order is the product's promise (README "Stopping"): health NOT_SERVING everywhere
first, then the state and token files go (so nobody attaches to a stopping instance), then the
web view, then the servers. A stop that has not ended `drain_s + STOP_REPORT_S` after it began
prints every task's chain of awaits; one that has not ended as long again exits the process
(a launcher's stop must end).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError
from cmemu.emulator.runtime import heap, metricserver, ports, state
from cmemu.emulator.runtime.attach import HOSTED, Attached, StaleInstanceError, attach
from cmemu.emulator.runtime.procs import Running
from cmemu.emulator.runtime.supernode import LaunchOptions, Supernode
from cmemu.emulator.runtime.taskdump import print_tasks
from cmemu.emulator.runtime.webview import NONE as UI_NONE
from cmemu.emulator.runtime.webview import WebView
from cmemu.emulator.runtime.webview.sources import DeviceSource, LocalDevices

__all__ = [
    "Attached",
    "Hosted",
    "StaleInstanceError",
    "attach",
    "stale_removed",
    "start",
    "view_source",
]

WEBVIEW_STOP_S = 5.0  # its feeds, streams and HTTP server
STOP_REPORT_S = 20.0  # a stop still going after the drain and this long says what it waits for


@dataclass(frozen=True, eq=False)
class Hosted:
    """An instance this process runs: the supernode and where others find it."""

    supernode: Supernode
    path: Path  # its state file
    view: WebView | None = None
    # set when a stop is asked (`attach(name).stop()`, or the caller's own event: `cmemu up`'s
    # signals); the host's `async with` ends when it likes, `wait_stop` serves until then
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_stop(self) -> None:
        """Return once a stop is asked: `async with start(...) as h: await h.wait_stop()`
        serves until someone attached stops it."""
        await self.stopping.wait()

    @property
    def name(self) -> str:
        return state.instance_name(self.path)

    @property
    def ui(self) -> str | None:
        return self.view.url if self.view is not None else None


def stale_removed(path: Path) -> int | None:
    """Before an instance writes `path`: raise state.AlreadyRunningError when the instance that
    wrote it is alive; remove the file when its launcher is gone (its pid: the caller says so)."""
    try:
        found = state.read_instance(path)
    except (EmulatorError, OSError, ValueError):  # none, or unreadable: it is overwritten
        return None
    if found.alive:
        raise state.AlreadyRunningError(found.name, found.launcher.pid, path)
    return found.launcher.pid if state.remove_if_written_by(path, found.launcher.pid) else None


@contextlib.asynccontextmanager
async def start(
    options: LaunchOptions,
    path: Path | None = None,
    *,
    name: str | None = None,
    ui: str = UI_NONE,
    block: ports.Block | None = None,
    stop: asyncio.Event | None = None,
    on_death: Callable[[Running], None] | None = None,
    argv: Sequence[str] = (),
) -> AsyncIterator[Hosted]:
    """The supernode of `options`, all SERVING, its state file written at `path`, or at the
    state file of instance `name` in the state directory (neither: the default instance's, as
    `cmemu up`), refused with AlreadyRunningError while another live instance holds it; on exit
    the stop above. `stop`, set while starting, aborts the start; set after, it is what
    `Hosted.wait_stop` waits for (and what `attach(name).stop()` sets)."""
    if path is not None and name is not None:
        raise InvalidArgumentError(f"a state file ({path}) or a name ({name!r}): one of them")
    path = path if path is not None else state.path_for(name or state.DEFAULT_NAME)
    await asyncio.to_thread(stale_removed, path)
    stop = stop if stop is not None else asyncio.Event()
    key = path.resolve()
    stopping: asyncio.TimerHandle | None = None
    # the start lasts until the state file is written: what waits for the end of the starts
    # (heap.after_starts: the HTTP endpoints' servers on their bound sockets) serves after it
    launching = contextlib.ExitStack()
    launching.enter_context(heap.starting())
    try:
        async with (
            Supernode.start(options, stop=stop, on_death=on_death) as sn,
            _webview(sn, ui) as view,
        ):
            launcher = _launcher_record(sn, view, block, argv)
            launcher |= await asyncio.to_thread(_guard_record, sn, path)
            await asyncio.to_thread(
                functools.partial(
                    state.write, path, sn.topology, mode=sn.mode, launcher=launcher,
                    others=sn.supernodes[1:],
                )
            )  # fmt: skip
            launching.close()
            if view is not None:  # after the state file: see WebView.bind and serve
                await view.serve()
                await view.start_feeds()
            HOSTED[key] = (asyncio.get_running_loop(), stop)
            try:
                yield Hosted(supernode=sn, path=path, view=view, stopping=stop)
            finally:
                HOSTED.pop(key, None)
                stopping = asyncio.get_running_loop().call_later(
                    options.drain_s + STOP_REPORT_S, _report_slow_stop
                )
                await sn.not_serving()  # before the web view and the rest are torn down
                await asyncio.to_thread(_forget, path, options)
    finally:
        launching.close()
        if stopping is not None:
            stopping.cancel()


def _forget(path: Path, options: LaunchOptions) -> None:
    """The files that let others attach: gone before the servers are."""
    state.remove_if_ours(path)
    state.remove_token(path)
    if options.tls == "auto" and options.tls_dir is not None:
        shutil.rmtree(options.tls_dir, ignore_errors=True)


def _guard_record(sn: Supernode, path: Path) -> dict[str, object]:
    """The launcher record's token file and CA: where clients find what they present."""
    record: dict[str, object] = {}
    if sn.security.token:
        record[state.TOKEN_FILE_KEY] = str(state.write_token(path, sn.security.token))
    if sn.security.tls is not None:
        record[state.TLS_CA_KEY] = str(sn.security.tls.ca.resolve())
    if sn.security.mqtt_user is not None:  # the broker's user (its password: the token)
        record[state.MQTT_USER_KEY] = sn.security.mqtt_user
    return record


def _launcher_record(
    sn: Supernode, view: WebView | None, block: ports.Block | None, argv: Sequence[str]
) -> dict[str, object]:
    """The state file's launcher record (but the token and CA: _guard_record)."""
    launcher: dict[str, object] = {"argv": list(argv)}
    if sn.run_dir is not None:
        launcher["run_dir"] = str(sn.run_dir)
    launcher[state.METRICS_KEY] = metricserver.supernode_endpoints(sn)
    launcher[state.UI_KEY] = view.url if view is not None else None
    if block is not None and block.bindings:
        launcher[state.PORTS_KEY] = block.record()
    if sn.supervisor is not None:  # procs mode: pids for process-kill/-pause faults
        launcher[state.PROCESSES_KEY] = state.processes_record(sn.supervisor.running)
    if sn.engine is not None:  # docker mode: the project, for the container faults
        launcher[state.CONTAINERS_KEY] = state.containers_record(sn.engine)
    return launcher


@contextlib.asynccontextmanager
async def _webview(sn: Supernode, ui: str) -> AsyncIterator[WebView | None]:
    """The live page of the machine (emulator/runtime/webview), unless `ui` is none."""
    if ui == UI_NONE:
        yield None
        return
    view = WebView(
        sn.clients,
        address=ui,
        profile=sn.options.profile,
        ssl_context=sn.security.server().ssl_context(),
        mqtt_login=sn.security.mqtt_login(),
        source=view_source(sn),
    )
    await view.bind()  # served, and its feeds started, once the state file is written (start)
    try:
        yield view
    finally:
        # the page goes first on a stop; a teardown that does not end must not keep the
        # servers from stopping (it is logged, the stop goes on)
        try:
            async with asyncio.timeout(WEBVIEW_STOP_S):
                await view.__aexit__(None, None, None)
        except TimeoutError:
            print(f"cmemu: the web view did not stop within {WEBVIEW_STOP_S:g} s", file=sys.stderr)


def view_source(sn: Supernode) -> DeviceSource | None:
    """Where the web view hears the devices (health, telemetry): from their servers directly
    when this process hosts every one (in process), else (None) over the network, as any other
    process would (procs, compose, Kubernetes)."""
    local = LocalDevices(sn.device_servers)
    return local if local.covers([d.id for d in sn.clients.topology.devices]) else None


def _report_slow_stop() -> None:
    """A stop that does not end is a bug: say what every task is waiting in, and if it still
    has not ended as long again, exit anyway."""
    asyncio.get_running_loop().call_later(STOP_REPORT_S, _give_up_stopping)
    print_tasks(f"still stopping {STOP_REPORT_S:g} s after the drain")


def _give_up_stopping() -> None:
    print("cmemu: the stop did not end; exiting without it (exit 1)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)
