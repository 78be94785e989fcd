"""The soak's output: the figures counted during the run, the targets, the lines printed (one
figure a line, which is what the smoke test and the lead read), bench/results/soak.json and the
plot of RSS and calls per second over the run."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import outputs
from bench.soak.calls import BAD, Figures
from bench.soak.sampling import Series

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TARGETS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("rss_growth_after_warmup", lambda v: v < 10.0, "< 10"),
    ("unknown_or_internal", lambda v: v == 0, "0"),
    ("lost_bytes", lambda v: v == 0, "0"),
    ("lost_objects", lambda v: v == 0, "0"),
    ("resurrected_objects", lambda v: v == 0, "0"),
    ("lost_counters", lambda v: v == 0, "0"),
    ("lost_messages", lambda v: v == 0, "0"),
    ("wrong_reads", lambda v: v == 0, "0"),
    ("not_serving_end", lambda v: v == 0, "0"),
    ("client_exceptions", lambda v: v == 0, "0"),
)

NOTES = {
    "soak_seconds": "wall seconds of load",
    "soak_ops": "calls answered, any status",
    "rss_start_mb": "cmemu up VmRSS before the load",
    "rss_warm_mb": "median over 10 s after the warm-up",
    "rss_end_mb": "median over the last 10 s of load",
    "rss_growth_after_warmup": "% from warm to end",
    "rss_minute_medians_mb": "each whole minute after the warm-up",
    "errors_by_status": "failed calls; expected NOT_FOUNDs excluded",
    "lost_bytes": "acknowledged UB bytes read back wrong",
    "lost_objects": "acknowledged EMS objects missing or wrong",
    "resurrected_objects": "deleted keys found again",
    "unknown_bytes": "bytes of failed writes: not checked",
    "wrong_reads": "reads during or after the run that disagreed with the ledger",
}

PRINTED = (
    "soak_seconds",
    "soak_ops",
    "soak_ops_per_s",
    "rss_start_mb",
    "rss_warm_mb",
    "rss_end_mb",
    "rss_growth_after_warmup",
    "rss_minute_medians_mb",
    "errors_by_status",
    "unknown_or_internal",
    "deadline_exceeded",
    "lost_bytes",
    "lost_objects",
    "resurrected_objects",
    "lost_counters",
    "lost_messages",
    "wrong_reads",
    "unknown_bytes",
    "unknown_objects",
    "objects_checked",
    "unexpected_messages",
    "messages_maybe_lost",
    "churn_regions_left",
    "faults_injected",
    "faults_by_kind",
    "big_objects",
    "ems_settled",
    "not_serving_end",
    "client_exceptions",
)


def summary(figures: Figures, series: Series, soak_seconds: float) -> dict[str, Any]:
    """The report's part from what was counted during the run: errors, faults, latencies,
    examples and the time series."""
    errors = figures.errors
    return {
        "errors_by_status": dict(errors.most_common()),
        "unknown_or_internal": sum(errors[code.name] for code in BAD),
        "deadline_exceeded": errors["DEADLINE_EXCEEDED"],
        "wrong_reads": len(figures.wrong_reads),
        "unexpected_messages": figures.unexpected_messages,
        "faults_injected": len(figures.fault_log),
        "faults_by_kind": dict(Counter(f["kind"] for f in figures.fault_log)),
        "big_objects": figures.big_objects,
        "client_exceptions": len(figures.client_exceptions),
        "errors_by_call": dict(figures.errors_by_call.most_common()),
        "wall_latency_by_call": {
            what: {
                "calls": int(n),
                "mean_ms": round(total / n * 1e3, 2),
                "max_ms": round(top * 1e3),
            }
            for what, (n, total, top) in sorted(figures.latency.items())
        },
        "examples": figures.examples,
        "wrong_read_examples": figures.wrong_reads[:100],
        "client_exception_examples": figures.client_exceptions[:50],
        "fault_log": figures.fault_log,
        "series": {
            "t": series.t,
            "rss_mb": series.rss_mb,
            "ops_per_s": [figures.per_second[s] for s in range(math.ceil(soak_seconds))],
            "ems": series.ems_objects,
        },
    }


def publish(report: dict[str, Any], directory: Path, warm_s: float) -> list[str]:
    """Print the figures, write soak.json and soak.png under `directory`, print the examples and
    the targets missed; the targets missed (also in the JSON)."""
    for name in PRINTED:
        value = report.get(name)
        shown = json.dumps(value) if isinstance(value, dict) else value
        note = NOTES.get(name, "")
        print(f"{name:<26} {shown}" + (f"  ({note})" if note else ""))
    missed = [
        f"{name} = {report.get(name)} (target {want})"
        for name, ok, want in TARGETS
        if not ok(report.get(name))
    ]
    report["targets_missed"] = missed
    outputs.write_json(directory, "soak", report)
    if plot(report, directory, warm_s):
        outputs.announce(directory, "soak")
    else:
        print(f"wrote {directory / 'soak.json'} (no plot: matplotlib is not installed)")
    for line in report["examples"][:10] + report["wrong_read_examples"][:10]:
        print(f"  example: {line}")
    for line in missed:
        print(f"TARGET MISSED: {line}")
    return missed


def plot(report: dict[str, Any], directory: Path, warm_s: float) -> bool:
    """RSS and operations per second over the run; False when matplotlib is missing."""
    title = (
        f"cm384 soak: {report['soak_ops']:,} calls in {report['soak_seconds']:.0f} s, "
        f"RSS growth after warm-up {report['rss_growth_after_warmup']:.1f}%"
    )
    try:
        with outputs.figure(
            directory, "soak", nrows=2, sharex=True, size=(10, 6), dpi=100, title=title
        ) as (top, bottom):
            _draw(report, top, bottom, warm_s)
    except ImportError:
        return False
    return True


def _draw(report: dict[str, Any], top: Axes, bottom: Axes, warm_s: float) -> None:
    series = report["series"]
    top.plot(series["t"], series["rss_mb"], color="tab:blue")
    top.set_ylabel("cmemu up RSS (MiB)")
    top.axvline(warm_s, color="grey", linestyle="--", label="end of warm-up")
    top.legend(loc="lower right")
    top.set_ylim(bottom=0)
    per_s = series["ops_per_s"]
    window = 5
    smooth = [sum(per_s[max(0, i - window + 1) : i + 1]) / window for i in range(len(per_s))]
    bottom.plot(range(len(per_s)), smooth, color="tab:green")
    for fault in report["fault_log"]:
        end = fault.get("cleared", fault["t"])
        bottom.axvspan(fault["t"], end, color="tab:red", alpha=0.08, linewidth=0)
    bottom.set_ylabel("calls answered / s (5 s mean)")
    bottom.set_xlabel("wall seconds (faults shaded)")
    bottom.set_ylim(bottom=0)
