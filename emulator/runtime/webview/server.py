"""The web view's HTTP side (aiohttp): one static page, its script and style, the machine as JSON
(`/api/snapshot`) and its changes as server-sent events (`/events`: a `snapshot` event with
everything, then a `diff` event per change, coalesced by the collector). The link feeds (the
busiest links, the L2 sub-planes) run only while some page holds `/events` open; a snapshot
taken with none open has their last values, and their `sources` say they idle.

`WebView` is what a launcher opens: the collector and the server together, over the
supernode's public interfaces (its topology and typed clients), in any launch mode, but for the
devices' health and telemetry when their servers run in the launcher's process
(webview/sources.py). Plain HTTP
on loopback by default: the page only reads (DESIGN principle 11).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import Mapping
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING

import structlog

from cmemu.emulator.client.clients import Clients
from cmemu.emulator.model.address import join_address
from cmemu.emulator.model.address import parse_address as parse_host_port
from cmemu.emulator.model.errors import InvalidArgumentError, bind_error
from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.runtime.webview.collector import Collector, Rates
from cmemu.emulator.runtime.webview.snapshot import Json, Machine
from cmemu.emulator.runtime.webview.sources import DeviceSource
from cmemu.services import listening

if TYPE_CHECKING:  # aiohttp is imported when the page is served (serve), not at boot
    from aiohttp import web

log = structlog.get_logger("cmemu.webview")
DEFAULT_HOST = "127.0.0.1"
AUTO = f"{DEFAULT_HOST}:0"  # `cmemu up` default: a free port the system picks
NONE = "none"
STATIC = {  # served name: content type
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
QUEUE = 64  # diffs a slow page may lag behind before it is sent the whole snapshot instead
KEEPALIVE_S = 15.0


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[v6]:PORT`; port 0: any free one) or `PORT` alone, on loopback."""
    whole = text if ":" in text else f"{DEFAULT_HOST}:{text}"
    try:
        at = parse_host_port(whole, what="web view address", any_port=True)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"bad web view address {text!r}: HOST:PORT (port 0: any free one), PORT, or 'none' "
            f"({exc})",
            field="ui",
        ) from exc
    return at.host, at.port


async def _read_static() -> dict[str, bytes]:
    def read() -> dict[str, bytes]:
        base = resources.files("cmemu.emulator.runtime.webview") / "static"
        return {name: (base / name).read_bytes() for name in STATIC}

    return await asyncio.to_thread(read)


class _Stream:
    """One page's SSE stream: diffs queue here; an overflow becomes one full snapshot."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.queue: asyncio.Queue[tuple[str, Json] | None] = asyncio.Queue(maxsize=QUEUE)

    def put(self, diff: Json) -> None:
        try:
            self.queue.put_nowait(("diff", diff))
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(("snapshot", self.machine.full()))

    def close(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)


class WebView:
    """Async context manager: the collector running and the page served at `url`."""

    def __init__(
        self,
        clients: Clients,
        *,
        address: str = AUTO,
        profile: HardwareProfile = DEFAULT_PROFILE,
        rates: Rates | None = None,
        ssl_context: ssl.SSLContext | None = None,
        mqtt_login: Mapping[str, str] | None = None,
        source: DeviceSource | None = None,
    ) -> None:
        """`source`: where the devices' health and telemetry come from (webview/sources.py);
        by default over the network (a Watch stream per device, calls), as from any other
        process."""
        self.host, self.port = parse_address(address)
        self._ssl = ssl_context  # HTTPS with the gRPC servers' certificate when they use TLS
        self.idle_s = profile.limits.http_idle_s  # a silent connection is closed after this
        self.machine = Machine(clients.topology, profile)
        self.collector = Collector(
            self.machine, clients, rates=rates, mqtt_login=mqtt_login, source=source
        )
        self._runner: web.AppRunner | None = None
        self._sockets: list[socket.socket] = []  # bound by `bind`, served by `serve`
        self._streams: set[_Stream] = set()
        self._static: dict[str, bytes] = {}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self._ssl else 'http'}://{host}:{self.port}/"

    async def __aenter__(self) -> WebView:
        await self.serve()
        await self.start_feeds()
        return self

    async def bind(self) -> None:
        """The page's address bound and listening, not served yet (serve): a launcher writes its
        state file, which names the page, before it pays for aiohttp (0.2 s of CPU to import);
        a page that connects meanwhile waits in the socket's backlog."""
        if self._sockets:
            return
        try:
            self._sockets = await listening.listen(self.host, self.port)
        except OSError as exc:
            raise bind_error("the web view", join_address(self.host, self.port), exc) from exc
        self.port = int(self._sockets[0].getsockname()[1])  # the one the system picked for 0

    async def serve(self) -> None:
        """The page served at `url` (bound first unless `bind` was), its feeds not started yet
        (start_feeds): a launcher writes its state file first, whose moment the view's 624
        health watches would otherwise delay (their connections crowd the event loop for
        0.3-0.5 s)."""
        if self._runner is not None:
            return
        await self.bind()
        from aiohttp import web

        self._static = await _read_static()
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._asset)
        app.router.add_get("/api/snapshot", self._snapshot)
        app.router.add_get("/events", self._events)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=1.0,
            keepalive_timeout=self.idle_s,
            # a page that goes away ends its stream at once, not at the next write (a keepalive
            # comes every 15 s): the link feeds run only while some page listens
            handler_cancellation=True,
        )
        await runner.setup()
        self._runner = runner
        for sock in self._sockets:
            await web.SockSite(runner, sock, ssl_context=self._ssl).start()
        log.debug("web view serving", url=self.url)

    async def start_feeds(self) -> None:
        """The collector running: the machine's state flows to the pages (once)."""
        if self.collector.running:
            return
        await self.collector.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for stream in list(self._streams):
            stream.close()
        await self.collector.__aexit__(None, None, None)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        listening.close(self._sockets)  # a view bound and never served, or what cleanup left

    # --- handlers ------------------------------------------------------------------------------

    async def _page(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def _asset(self, request: web.Request) -> web.Response:
        from aiohttp import web

        name = request.match_info["name"]
        if name not in STATIC or name == "index.html":
            raise web.HTTPNotFound(text=f"no {name}")
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        from aiohttp import web

        return web.Response(
            body=self._static[name],
            headers={"Content-Type": STATIC[name], "Cache-Control": "no-cache"},
        )

    async def _snapshot(self, request: web.Request) -> web.Response:
        from aiohttp import web

        return web.json_response(self.machine.full())

    async def _events(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        stream = _Stream(self.machine)
        self._streams.add(stream)
        stop_listening = self.collector.listen(stream.put)
        try:
            await response.write(_sse("snapshot", self.machine.full()))
            while True:
                try:
                    item = await asyncio.wait_for(stream.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if item is None:
                    break
                await response.write(_sse(*item))
        except ConnectionResetError:  # the page went away
            pass
        finally:
            stop_listening()
            self._streams.discard(stream)
        return response


def _sse(event: str, data: Json) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
