"""`python -m bench.soak`: the arguments, a cm384 in one process (`cmemu up`, its output
discarded), the soak against it, and the report; exit code 1 when a target is missed. What the
soak does is in the package's docstring (and --help)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

import bench.soak
from bench.outputs import RESULTS
from bench.soak.config import PAIR_MAX_DIES, warm_up_s
from bench.soak.report import publish
from bench.soak.run import run
from cmemu.emulator.model.topology import build, server_count
from cmemu.emulator.runtime import memdebug
from cmemu.emulator.testing import cmemu_up, free_port_block


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=bench.soak.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--keys", type=int, default=256, help="EMS key space")
    parser.add_argument(
        "--big-every", type=float, default=45.0, help="seconds between 16-64 MiB objects"
    )
    parser.add_argument("--broker", default="embedded", help="'embedded' (MQTT load too) or 'none'")
    parser.add_argument(
        "--long-outages",
        type=float,
        default=0.3,
        help="share of pool outages held past EMS's dead-after time (runs of 70 s or more)",
    )
    parser.add_argument(
        "--pair-max-dies",
        type=int,
        default=PAIR_MAX_DIES,
        help="most dies in a per-pair all-to-all (its fabric time grows with flows squared)",
    )
    parser.add_argument(
        "--memdebug",
        type=Path,
        help="a directory: the server writes memory reports there (emulator/runtime/memdebug.py)"
        " after the warm-up and every --memdebug-every seconds; slows the run, so not for figures",
    )
    parser.add_argument("--memdebug-every", type=float, default=120.0)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where soak.json/png go")
    return parser.parse_args(argv)


def main() -> int:
    args = parse()
    base = free_port_block(server_count(build("cm384")))
    up_args = ["--preset", "cm384", "--base-port", str(base)]
    if args.broker != "embedded":
        up_args += ["--broker", args.broker]
    if args.memdebug is not None:  # the server inherits it
        os.environ[memdebug.ENV] = str(args.memdebug.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        with cmemu_up(path, *up_args, quiet=True) as proc:
            print(f"cm384 in one process (cmemu up, pid {proc.pid}); client in this process")
            report = asyncio.run(run(path, args, proc.pid, lambda: proc.poll() is None))
    report["args"] = {k: str(v) for k, v in vars(args).items()}
    missed = publish(report, args.results, warm_up_s(args.seconds))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
