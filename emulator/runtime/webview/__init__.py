"""The live web view of a running supernode: `cmemu up` serves it (`--ui ADDR|none`).

collector.py keeps a picture of the machine (snapshot.py) up to date from the supernode's
public interfaces (gRPC health Watch streams, telemetry and fabric polls, the router's stats,
MQTT events), but for the devices' health and telemetry when their servers run in this process
(sources.py: read from them directly); server.py serves one static page (static/: plain
HTML, CSS and JS, no build) that follows it over server-sent events.
"""

from cmemu.emulator.runtime.webview.collector import Collector, Rates
from cmemu.emulator.runtime.webview.server import AUTO, NONE, WebView, parse_address
from cmemu.emulator.runtime.webview.snapshot import Machine

__all__ = ["AUTO", "NONE", "Collector", "Machine", "Rates", "WebView", "parse_address"]
