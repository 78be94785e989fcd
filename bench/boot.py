"""Boot benchmark: `cmemu up` from process start to all-SERVING (state file written), and peak RSS.

    python bench/boot.py                      # cm384, median of 3
    python bench/boot.py --preset cm8192 --addressing loopback --runs 1

Targets on a 2-core machine: cm384 within 3 s and 400 MB; stretch cm8192 within 60 s and 4 GB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from emulator.model.topology import build, server_count
from emulator.testing import cmemu_up, free_port_block


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def one_run(preset: str, addressing: str, timeout_s: float, broker: str) -> tuple[float, float]:
    servers = server_count(build(preset))
    where = ["--addressing", addressing, *(["--broker", broker] if broker else [])]
    if addressing == "ports":
        where += ["--base-port", str(free_port_block(servers))]
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.json"
        started = time.perf_counter()
        with cmemu_up(state, "--preset", preset, *where, timeout_s=timeout_s, quiet=True) as proc:
            boot_s = time.perf_counter() - started
            rss = peak_rss_mb(proc.pid)
    return boot_s, rss


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="cm384")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--addressing", choices=["ports", "loopback"], default="ports")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--broker", default="", help="passed to cmemu up ('none': no MQTT; default: embedded)"
    )
    args = parser.parse_args()
    devices = len(build(args.preset).devices)
    results = [
        one_run(args.preset, args.addressing, args.timeout, args.broker) for _ in range(args.runs)
    ]
    boots = [b for b, _ in results]
    rss = [r for _, r in results]
    print(f"preset {args.preset}: {devices} devices, one gRPC server each, one process")
    print("runs        " + "  ".join(f"{b:.2f}s/{r:.0f}MB" for b, r in results))
    median_boot = statistics.median(boots)
    print(f"boot_s      median {median_boot:.2f}  (start to all-SERVING, state file written)")
    print(f"peak_rss_mb median {statistics.median(rss):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
