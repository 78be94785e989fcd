"""Where a benchmark's figures go: `<dir>/<name>.json` and `<dir>/<name>.png` (matplotlib, Agg).

One writer for every benchmark, so that each only decides what its figures are and how its plot
looks; the README shows the PNGs, the lead reads the JSON. The default directory is
bench/results/; every benchmark takes `--results DIR` (tests write to a temporary one).

    parser = argparse.ArgumentParser(...)
    outputs.add_option(parser)
    ...
    with outputs.figure(args.results, "boot", ncols=2) as (time_ax, rss_ax):
        outputs.bars(time_ax, ["run 1"], {"boot": [1.2]}, targets={"target": 3.0}, ...)
    outputs.write_json(args.results, "boot", doc)

The two shapes most benchmarks need are here (`bars`: measured values, optionally beside a
published or target value; `over_time`: series against a common x); anything else is drawn on
the axes `figure` yields. (Not bench/results.py: that name is the results directory's, which
mypy would take for a namespace package.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RESULTS = Path(__file__).resolve().parent / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def add_option(parser: argparse.ArgumentParser) -> None:
    """`--results DIR`, the same for every benchmark."""
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        metavar="DIR",
        help=f"where NAME.json and NAME.png go (default {RESULTS})",
    )


def write_json(directory: Path, name: str, doc: Any) -> Path:
    """`doc` as indented JSON: dataclasses as their fields, anything else unknown as `str`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, default=_plain) + "\n")
    return path


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _pyplot() -> Any:
    """pyplot on the Agg backend: benchmarks run headless and must never open a window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def figure(
    directory: Path,
    name: str,
    *,
    nrows: int = 1,
    ncols: int = 1,
    size: tuple[float, float] | None = None,
    title: str = "",
    sharex: bool = False,
    dpi: int = 110,
) -> Iterator[list[Axes]]:
    """A figure of nrows x ncols axes (a flat list, row by row), saved as `<name>.png` when the
    block ends without an exception, and closed either way (a long run plots more than once)."""
    plt = _pyplot()
    width, height = size or (5.0 * ncols + 1.0, 4.0 * nrows + 0.5)
    fig: Figure
    fig, grid = plt.subplots(nrows, ncols, figsize=(width, height), sharex=sharex, squeeze=False)
    try:
        yield [ax for row in grid for ax in row]
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        directory.mkdir(parents=True, exist_ok=True)
        fig.savefig(directory / f"{name}.png", dpi=dpi)
    finally:
        plt.close(fig)


def bars(
    ax: Axes,
    labels: Sequence[str],
    measured: Mapping[str, Sequence[float]],
    *,
    targets: Mapping[str, float] | None = None,
    ylabel: str = "",
    title: str = "",
    log: bool = False,
    value_format: str = "%.3g",
) -> None:
    """Grouped bars: one group per label, one bar per measured series (its legend entry); each
    target or published value is a dashed horizontal line with its name."""
    series = list(measured.items())
    width = 0.8 / max(len(series), 1)
    for k, (name, values) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
        drawn = ax.bar(xs, list(values), width, label=name)
        ax.bar_label(drawn, fmt=value_format, fontsize=7)
    for k, (name, level) in enumerate((targets or {}).items()):
        ax.axhline(level, linestyle="--", linewidth=1, color=f"C{len(series) + k}", label=name)
    ax.set_xticks(range(len(labels)), list(labels))
    if log:
        ax.set_yscale("log")
    ax.set(ylabel=ylabel, title=title)
    if len(series) > 1 or targets:
        ax.legend(fontsize=8)


def over_time(
    ax: Axes,
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    targets: Mapping[str, float] | None = None,
    style: str = "-",
    logx: bool = False,
) -> None:
    """Lines of `series` against a common `x` (time, or a swept parameter), targets dashed."""
    for name, values in series.items():
        ax.plot(list(x), list(values), style, label=name)
    for k, (name, level) in enumerate((targets or {}).items()):
        ax.axhline(level, linestyle="--", linewidth=1, color=f"C{len(series) + k}", label=name)
    if logx:
        ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if len(series) > 1 or targets:
        ax.legend(fontsize=8)


def announce(directory: Path, name: str) -> None:
    """The line every benchmark ends with: what it wrote, where."""
    written = [p for p in (directory / f"{name}.json", directory / f"{name}.png") if p.exists()]
    print("wrote " + " and ".join(str(p) for p in written))


def positive(text: str) -> float:
    """An argparse type: a number > 0 (a usage error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a number > 0, not {text!r}")
    return value
