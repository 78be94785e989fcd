"""The launch options per mode (issue 18 item 6): each mode's class holds only what that mode
reads and refuses a bad value when made, with a message naming the mode and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmemu.emulator.model.addressplans import LoopbackPlan, PortPlan
from cmemu.emulator.model.errors import InvalidArgumentError, UnknownNameError
from cmemu.emulator.runtime.launchmodes import Compose, Docker, InProcess, K8s, Procs
from cmemu.emulator.runtime.supernode import LaunchOptions


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: InProcess(plan=PortPlan(base_port=0)), "mode inprocess: base_port 0: from 1"),
        (lambda: InProcess(plan=PortPlan(base_port=70000)), "base_port 70000: from 1 to 65535"),
        (lambda: InProcess(plan=PortPlan(host="")), "mode inprocess: the host to bind is empty"),
        (lambda: InProcess(plan="ports"), "plan must be a PortPlan or a LoopbackPlan"),  # type: ignore[arg-type]
        (lambda: Procs(plan=LoopbackPlan(first_octet=0)), "mode procs: first_octet 0: 127.N"),
        (lambda: Procs(plan=LoopbackPlan(first_octet=255)), "first_octet 255: 127.N with N"),
        (lambda: Procs(plan=LoopbackPlan(port=0)), "mode procs: port 0: from 1 to 65535"),
        (lambda: Procs(run_dir="/tmp/x"), "mode procs: run_dir must be a Path"),  # type: ignore[arg-type]
        (lambda: Compose(file="cm-mini.yaml"), "mode compose: file must be a Path"),  # type: ignore[arg-type]
        (lambda: K8s(manifests="k8s/"), "mode k8s: manifests must be a Path"),  # type: ignore[arg-type]
        (lambda: Docker(compose_file=Path("f.yaml"), per="node"), "per goes with a generated"),
        (lambda: Docker(image=""), "mode docker: the image is empty"),
        (lambda: Docker(project="Not Valid"), "compose project 'Not Valid': lower case"),
        (lambda: Docker(engine_octet=300), "mode docker: engine_octet 300: 127.N"),
    ],
)
def test_a_bad_mode_option_is_refused_by_its_mode(make: object, said: str) -> None:
    assert callable(make)
    with pytest.raises(InvalidArgumentError, match=said):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: Procs(per="rack"),  # type: ignore[arg-type]
        lambda: Docker(per="rack"),  # type: ignore[arg-type]
    ],
)
def test_an_unknown_per_lists_the_known_ones(make: object) -> None:
    assert callable(make)
    with pytest.raises(UnknownNameError, match="device, node"):
        make()


def test_the_common_options_are_checked_whatever_the_mode(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="mode must be one of InProcess"):
        LaunchOptions(mode="procs")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="drain_s must be >= 0"):
        LaunchOptions(drain_s=-1.0)
    with pytest.raises(InvalidArgumentError, match="ready_timeout_s must be > 0"):
        LaunchOptions(ready_timeout_s=0.0)
    # the preset is checked only where it says what runs
    with pytest.raises(UnknownNameError, match="unknown preset"):
        LaunchOptions(preset="cm999", mode=Docker())
    LaunchOptions(preset="cm999", mode=Docker(compose_file=tmp_path / "f.yaml"))
    LaunchOptions(preset="cm999", mode=Compose(file=tmp_path / "f.yaml"))


def test_each_mode_keeps_its_defaults_and_says_what_it_is(tmp_path: Path) -> None:
    assert LaunchOptions().mode == InProcess(plan=PortPlan())
    procs = LaunchOptions(preset="cm-mini", mode=Procs(per="device"))
    assert procs.plan == LoopbackPlan()  # an address each, as containers have
    assert procs.topology().devices[0].address.startswith("127.10.")
    assert procs.mode.describe("cm-mini") == "procs per device"
    assert Docker().generated_per == "device"  # one container per device, as `cmemu up`
    assert Docker().describe("cm-mini") == "docker cm-mini per device"
    given = Docker(compose_file=tmp_path / "f.yaml")
    assert given.describe("cm-mini") == f"docker {tmp_path / 'f.yaml'}"
    assert Compose(file=tmp_path / "f.yaml").describe("x") == f"compose {tmp_path / 'f.yaml'}"
    assert LaunchOptions(mode=K8s(manifests=tmp_path, run_dir=tmp_path / "r")).run_dir == (
        tmp_path / "r"
    )
