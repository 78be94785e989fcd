"""`cmemu --fork-server`: the fork server of process mode (emulator/runtime/forkserver.py), given
what it preloads and runs: exactly what `cmemu serve` imports, and the `cmemu` entry point.

Hidden (the supervisor starts it, nobody types it): it imports the serve command and the modules
a serve process imports only once it runs, never the CLI's other commands (tests/runtime/
test_forkserver.py checks the list against a serve process's own)."""

from __future__ import annotations

import importlib
import sys

from cmemu.emulator.runtime import forkserver

# imported by a running `cmemu serve`, after its command line is parsed: the logging setup
# (cli/main.py _run), the device engine's UB (engines/device/engine.py), asyncio.to_thread's pool
SERVE_LAZY = (
    "cmemu.emulator.runtime.logs",
    "cmemu.emulator.engines.device.ub",
    "concurrent.futures.thread",
)


def preload() -> None:
    """Import what `cmemu serve` imports: its command's parser (cli/main.py imports the command's
    module when the command is named, and that module the serve path), then SERVE_LAZY."""
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]  # as emulator/cli/entry.py
    from cmemu.emulator.cli.main import build_parser

    build_parser(["serve"])
    for module in SERVE_LAZY:
        importlib.import_module(module)


def main(args: list[str]) -> int:
    """`args`: the modules to import beside the serve path, and the padding argument."""
    from cmemu.emulator.cli.entry import main as entry

    modules = [a for a in args if a.strip()]
    return forkserver.main(sys.argv[0], modules, preload=preload, run=entry)
