"""The `cmemu` console script: `cmemu --version` answers from the package metadata alone; every
other command imports the command line (emulator/cli/main.py) and runs it. The full parser
imports grpcio, the emulator and its services (about 0.6 s of CPU): a version query, which
scripts and healthchecks ask often, should not pay for them."""

from __future__ import annotations

import sys

DISTRIBUTION = "cloudmatrix-emulator"
FORK_SERVER = "--fork-server"  # hidden: process mode's fork server (emulator/runtime/forkserver.py)


def version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _terminal() -> bool:
    """stderr is a terminal: where progress bars may be drawn (progress.wanted)."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print(f"cmemu {version()}")
        return 0
    if args[:1] == [FORK_SERVER]:
        from cmemu.emulator.cli.forkserve import main as fork_server

        return fork_server(args[1:])
    if "serve" in args or not _terminal():
        # structlog's console renderer imports rich when it is installed (85 modules with
        # pygments, 4.4 MB of memory and about 0.1 s per process); the emulator logs JSON and
        # never renders with it. Only a progress bar (emulator/cli/progress.py) draws with rich,
        # and only on a terminal: `cmemu serve` (hundreds of processes and containers) and any
        # command whose stderr is no terminal (a pipe, a log file, a benchmark, a detached
        # `cmemu up`) go without it; an absent rich is what structlog expects to handle
        sys.modules.setdefault("rich", None)  # type: ignore[arg-type]
    from cmemu.emulator.cli.main import main as full

    return full(argv)


if __name__ == "__main__":
    sys.exit(main())
