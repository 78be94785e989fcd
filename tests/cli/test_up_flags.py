"""`cmemu up`'s flags per mode (issue 18 item 6): a flag the chosen mode does not read is a
usage error (exit 2, naming the flag), refused before anything starts; the flags a mode reads
build its typed options."""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import pytest

from cmemu.emulator.cli.main import build_parser
from cmemu.emulator.cli.main import main as cli_main
from cmemu.emulator.cli.upmodes import launch_options
from cmemu.emulator.model.addressplans import LoopbackPlan, PortPlan
from cmemu.emulator.runtime.launchmodes import Compose, InProcess, K8s, Procs
from cmemu.emulator.testing import run_cmemu


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--per", "node"), "--per: not read by in-process mode"),
        (("--port", "5000"), "--port goes with loopback addresses"),
        (("--mode", "procs", "--base-port", "21000"), "--base-port go with ports addressing"),
        (("--mode", "procs", "--addressing", "ports", "--port", "1"), "--port goes with loopback"),
        (("--addressing", "loopback", "--host", "0.0.0.0"), "--host go with ports addressing"),
        (("--from-k8s", "k8s", "--mode", "procs"), "--from-k8s runs the manifests' containers"),
        (("--from-k8s", "k8s", "--base-port", "21000"), "--base-port: not read by --from-k8s"),
        (("--from-k8s", "k8s", "--per", "node"), "--per: not read by --from-k8s"),
        (("--from-compose", "f.yaml", "--per", "node"), "--per: not read by compose"),
        (("--from-compose", "f.yaml", "--mode", "procs"), "goes with --mode compose, not procs"),
        (("--mode", "compose", "--host", "0.0.0.0"), "--host: not read by compose"),
        (("--mode", "compose", "--loopback", "127.11"), "--loopback: not read by compose"),
        (("--image", "x:1"), "--image goes with the Docker engine"),
        (("--from-compose", "f.yaml", "--engine", "local", "--image", "x:1"), "--image goes"),
    ],
)
def test_a_flag_the_mode_does_not_read_is_a_usage_error(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    up = run_cmemu("up", "--preset", "cm-mini", *args, "--state-file", str(tmp_path / "s.json"))
    assert up.returncode == 2 and said in up.stderr, up.stderr
    assert not (tmp_path / "s.json").exists()


def _options(tmp_path: Path, *args: str) -> object:
    argv = ["up", "--preset", "cm-mini", *args]
    parsed: argparse.Namespace = build_parser(argv).parse_args(argv)
    return launch_options(parsed, tmp_path / "x.json").mode


def test_the_flags_a_mode_reads_build_its_options(tmp_path: Path) -> None:
    assert _options(tmp_path) == InProcess(plan=PortPlan())
    assert _options(tmp_path, "--base-port", "30000", "--host", "127.0.0.2") == InProcess(
        plan=PortPlan(host="127.0.0.2", base_port=30000)
    )
    assert _options(tmp_path, "--addressing", "loopback", "--loopback", "127.12") == InProcess(
        plan=LoopbackPlan(first_octet=12)
    )
    run_dir = tmp_path / f"x-run-{os.getpid()}"
    procs = _options(tmp_path, "--mode", "procs", "--per", "device", "--port", "5000")
    assert procs == Procs(per="device", plan=LoopbackPlan(port=5000), run_dir=run_dir)
    on_ports = _options(tmp_path, "--mode", "procs", "--addressing", "ports", "--base-port", "1")
    assert on_ports == Procs(plan=PortPlan(base_port=1), run_dir=run_dir)
    assert _options(tmp_path, "--from-k8s", "k8s") == K8s(manifests=Path("k8s"), run_dir=run_dir)
    assert _options(tmp_path, "--from-compose", "f.yaml") == Compose(
        file=Path("f.yaml"), run_dir=run_dir
    )


@pytest.mark.parametrize(
    ("argv", "frozen"), [(["up", "--help"], True), (["down", "--help"], False)]
)
def test_a_server_command_freezes_what_its_imports_made(
    argv: list[str], frozen: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cmemu up` and `serve` import with the cyclic collector paused and freeze the modules'
    objects (emulator/cli/main.py); any other command leaves the collector as it was."""
    gc.unfreeze()
    try:
        with pytest.raises(SystemExit):
            cli_main(argv)
        assert gc.isenabled()
        assert (gc.get_freeze_count() > 0) is frozen
    finally:
        gc.unfreeze()
    assert "usage: cmemu" in capsys.readouterr().out
