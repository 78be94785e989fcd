"""`cmemu usage`: what each tenant of the OpenAI endpoint used (Router/GetUsage), as a table, or
as CSV or JSON for billing. The figures are the sums of the responses' `usage`."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
from collections.abc import Callable
from typing import Any

from cmemu.emulator.client.router import RouterClient, UsageReport
from cmemu.emulator.runtime import state

FIELDS = (
    "tenant",
    "priority",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "total_tokens",
    "rejected",
    "quota_tokens",
)


async def _report(args: argparse.Namespace) -> UsageReport:
    path = state.path_from(args.state_file)
    clients = state.clients(path)
    try:
        return await RouterClient(clients).usage(args.tenant or "")
    finally:
        await clients.close()


def _rows(report: UsageReport) -> list[dict[str, Any]]:
    return [{name: getattr(t, name) for name in FIELDS} for t in report.tenants]


def cmd_usage(args: argparse.Namespace) -> int:
    report = asyncio.run(_report(args))
    rows = _rows(report)
    out = sys.stdout
    if args.format == "json":
        json.dump({"at_ns": report.at_ns, "tenants": rows}, out, indent=2)
        out.write("\n")
    elif args.format == "csv":
        writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    else:
        widths = {f: max(len(f), *(len(f"{r[f]:,}" if isinstance(r[f], int) else str(r[f]))
                                   for r in rows)) for f in FIELDS}  # fmt: skip
        print("  ".join(f"{f.upper():<{widths[f]}}" for f in FIELDS).rstrip())
        for r in rows:
            cells = [
                f"{r[f]:>{widths[f]},}" if isinstance(r[f], int) else f"{r[f]:<{widths[f]}}"
                for f in FIELDS
            ]
            print("  ".join(cells).rstrip())
        print(f"{len(rows)} tenant{'' if len(rows) == 1 else 's'}")
    return 0


def usage_args(
    p: argparse.ArgumentParser, add_state: Callable[[argparse.ArgumentParser], None]
) -> None:
    p.add_argument("--tenant", help="one tenant (default: every tenant)")
    p.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="table (default), or csv / json for a billing export",
    )
    p.add_argument(
        "--json", dest="format", action="store_const", const="json", help="= --format json"
    )
    add_state(p)
