"""The web view: a real `cmemu up` serving the page, a real headless Chromium (Debian's, through
Selenium and /usr/bin/chromedriver) reading it, and faults injected through the real CLI.

The issue's acceptance criterion is the one wall-clock bound here: a device fault injected with
`cmemu fault add` turns its dies red in the page within 2 s (WebDriverWait polls the DOM).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cmemu.emulator.model.addressplans import LoopbackPlan, PortPlan
from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.hardware import DEFAULT_PROFILE
from cmemu.emulator.model.naming import die_id
from cmemu.emulator.model.topology import DeviceKind, Topology, build, server_count
from cmemu.emulator.runtime import state
from cmemu.emulator.runtime.launchmodes import InProcess, Procs
from cmemu.emulator.runtime.supernode import NO_BROKER, LaunchOptions
from cmemu.emulator.runtime.webview import Machine, WebView, parse_address
from cmemu.emulator.runtime.webview.collector import IDLE, Rates
from cmemu.emulator.runtime.webview.snapshot import (
    LinkSample,
    layout,
    plane_of_links,
    plane_utilisation,
)
from cmemu.emulator.testing import (
    MINI_PORTS,
    cmemu_up,
    free_port_block,
    hosted_instance,
    next_sse_event,
    run_cmemu,
    running_supernode,
)
from cmemu.v1 import fabric_pb2

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
RED = "rgb(220, 38, 38)"  # --bad in style.css, as the browser computes it
FAULT_SHOWS_S = 2.0  # the bound, wall clock
PAGE_LOADS_S = 30.0


def npu_dies(topology: Topology) -> set[str]:
    return {
        die_id(d.id, i)
        for d in topology.of_kind(DeviceKind.NPU)
        for i in range(DEFAULT_PROFILE.npu.dies)
    }


# --- the picture, without a browser -----------------------------------------------------------


def test_layout_groups_every_die_by_rack_and_node() -> None:
    topology = build("cm384")
    doc = layout(topology, DEFAULT_PROFILE)
    [sn] = doc["supernodes"]
    assert sn["id"] == "sn0"
    assert len(sn["racks"]) == 48 // DEFAULT_PROFILE.node.nodes_per_rack == 12
    assert all(len(r["nodes"]) == DEFAULT_PROFILE.node.nodes_per_rack for r in sn["racks"])
    dies = {d for r in sn["racks"] for n in r["nodes"] for npu in n["npus"] for d in npu["dies"]}
    assert dies == npu_dies(topology)
    assert len(dies) == 768


def test_two_supernodes_are_grouped_apart() -> None:
    """A document holding two supernodes (ids prefixed `sn1-`) draws two groups of racks."""
    one = build("cm-mini")
    second = [dataclasses.replace(d, id=f"sn1-{d.id}", node=f"sn1-{d.node}") for d in one.devices]
    both = dataclasses.replace(
        one,
        nodes=(*one.nodes, *(f"sn1-{n}" for n in one.nodes)),
        devices=(*one.devices, *second),
    )
    doc = layout(both, DEFAULT_PROFILE)
    assert [sn["id"] for sn in doc["supernodes"]] == ["sn0", "sn1"]
    dies = [
        d
        for sn in doc["supernodes"]
        for r in sn["racks"]
        for n in r["nodes"]
        for npu in n["npus"]
        for d in npu["dies"]
    ]
    assert len(dies) == len(set(dies)) == 2 * 32
    assert "sn1-n01-npu7.d1" in dies
    assert Machine(both, DEFAULT_PROFILE).full()["layout"] == doc


def test_plane_utilisation_is_rate_over_live_capacity() -> None:
    topology = build("cm-mini")
    planes = plane_of_links(topology)
    assert set(planes.values()) == set(range(7))
    l1l2 = [link for link in topology.links if f"{link.a}>{link.b}" in planes]
    first, second = [x for x in l1l2 if planes[f"{x.a}>{x.b}"] == 0][:2]
    samples = [
        LinkSample(
            link=f"{first.a}>{first.b}",
            kind="l1-l2",
            capacity_gb_s=100.0,
            bytes=5,
            utilization=0.5,
            active_flows=1,
            up=True,
        ),
        LinkSample(
            link=f"{second.b}>{second.a}",
            kind="l1-l2",
            capacity_gb_s=300.0,
            bytes=0,
            utilization=0.0,
            active_flows=0,
            up=False,
        ),
        LinkSample(  # a die port: no sub-plane of its own in this view
            link=next(f"{x.a}>{x.b}" for x in topology.links if f"{x.a}>{x.b}" not in planes),
            kind="die-l1",
            capacity_gb_s=1.0,
            bytes=1,
            utilization=1.0,
            active_flows=1,
            up=True,
        ),
    ]
    result = plane_utilisation(samples, planes)
    assert result["0"] == {"utilization": 50 / 400, "capacity_gb_s": 400.0, "links_down": 1}
    assert result["1"] == {"utilization": 0.0, "capacity_gb_s": 0.0, "links_down": 0}


def test_machine_diffs_only_what_changed_and_times_recoveries() -> None:
    now = [100.0]
    machine = Machine(build("cm-mini"), DEFAULT_PROFILE, clock=lambda: now[0])
    machine.diff()
    assert machine.diff() == {}
    machine.update_device("n00-npu1", health="SERVING")
    machine.diff()
    machine.update_device("n00-npu1", health="SERVING", utilization=0.0)
    assert set(machine.diff()["devices"]) == {"n00-npu1"}
    machine.update_device("n00-npu1", health="NOT_SERVING")
    now[0] += 3.0
    machine.update_device("n00-npu1", health="SERVING")
    diff = machine.diff()
    assert diff["recovery"]["recovered"] == 1
    assert diff["recovery"]["last_s"] == pytest.approx(3.0)  # time_scale 1
    assert machine.full()["devices"]["n00-npu1"]["health"] == "SERVING"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("127.0.0.1:0", ("127.0.0.1", 0)), ("8080", ("127.0.0.1", 8080)), ("[::1]:9", ("::1", 9))],
)
def test_addresses(text: str, parsed: tuple[str, int]) -> None:
    assert parse_address(text) == parsed


@pytest.mark.parametrize("bad", ["", "host:", "host:http", "1.2.3.4:70000", "-1"])
def test_bad_addresses(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_address(bad)


def test_bad_ui_option_is_a_usage_error(tmp_path: Path) -> None:
    done = run_cmemu("up", "--ui", "localhost:http", "--state-file", str(tmp_path / "s.json"))
    assert done.returncode == 2
    assert "bad web view address" in done.stderr
    assert not (tmp_path / "s.json").exists()


# --- a real cmemu up ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Iterator[state.Instance]:
    """cm-mini with its web view, hosted in this process (no CLI between: the page, the CLI's
    faults and the browser attach to it by its state file)."""
    path = tmp_path_factory.mktemp("webview") / "wv.json"
    plan = PortPlan(base_port=free_port_block(MINI_PORTS))
    options = LaunchOptions(preset="cm-mini", mode=InProcess(plan=plan), broker=NO_BROKER)
    with hosted_instance(options, path, ui="127.0.0.1:0", timeout_s=120.0) as instance:
        yield instance


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip(f"no {CHROMIUM} or {CHROMEDRIVER}: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never download anything
    with tempfile.TemporaryDirectory(prefix="cmemu-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={profile}", "--window-size=1600,1000"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def _dies_in_page(driver: Any) -> dict[str, dict[str, str]]:
    """Every die cell: its health attribute and computed colour."""
    result: dict[str, dict[str, str]] = driver.execute_script(
        """
        const out = {};
        for (const c of document.querySelectorAll('.die[data-die]')) {
          out[c.dataset.die] = {health: c.dataset.health || '',
                                colour: getComputedStyle(c).backgroundColor};
        }
        return out;
        """
    )
    return result


def _open(driver: Any, instance: state.Instance) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    assert instance.launcher.ui is not None
    driver.get(instance.launcher.ui)
    dies = npu_dies(instance.topology)
    WebDriverWait(driver, PAGE_LOADS_S, poll_frequency=0.1).until(
        lambda d: (
            set(_dies_in_page(d)) == dies
            and all(v["health"] == "SERVING" for v in _dies_in_page(d).values())
        )
    )


def test_the_page_shows_every_npu_die(browser: Any, mini: state.Instance) -> None:
    _open(browser, mini)
    cells = _dies_in_page(browser)
    assert set(cells) == npu_dies(mini.topology)
    assert len(cells) == 32
    assert all(v["colour"] != RED for v in cells.values())
    nodes = browser.execute_script(
        "return [...document.querySelectorAll('.node[data-node]')].map(n => n.dataset.node)"
    )
    assert nodes == list(mini.topology.nodes)
    assert "cm-mini" in browser.title or "cm-mini" in browser.find_element("id", "title").text


def test_a_cli_fault_turns_its_dies_red_within_2_s_and_back(
    browser: Any, mini: state.Instance
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    _open(browser, mini)
    device = "n01-npu3"
    mine = {die_id(device, i) for i in range(DEFAULT_PROFILE.npu.dies)}

    def red(d: Any) -> bool:
        cells = _dies_in_page(d)
        return all(cells[x]["colour"] == RED and cells[x]["health"] != "SERVING" for x in mine)

    added = run_cmemu("fault", "add", "device-down", device, "--state-file", str(mini.path))
    assert added.returncode == 0, added.stderr
    try:
        WebDriverWait(browser, FAULT_SHOWS_S, poll_frequency=0.05).until(red)
        others = {k: v for k, v in _dies_in_page(browser).items() if k not in mine}
        assert all(v["colour"] != RED for v in others.values())
        WebDriverWait(browser, 10, poll_frequency=0.1).until(
            lambda d: (
                f"dev:{device}"
                in d.execute_script(
                    "return [...document.querySelectorAll('#faults tr[data-fault]')]"
                    ".map(r => r.dataset.fault)"
                )
            )
        )
    finally:
        cleared = run_cmemu("fault", "rm", f"dev:{device}", "--state-file", str(mini.path))
    assert cleared.returncode == 0, cleared.stderr
    WebDriverWait(browser, FAULT_SHOWS_S, poll_frequency=0.05).until(
        lambda d: all(_dies_in_page(d)[x]["health"] == "SERVING" for x in mine)
    )
    assert all(_dies_in_page(browser)[x]["colour"] != RED for x in mine)


def test_colour_by_hbm_or_utilisation_keeps_faults_red(browser: Any, mini: state.Instance) -> None:
    from selenium.webdriver.support.ui import Select, WebDriverWait

    _open(browser, mini)
    device = "n00-npu5"
    added = run_cmemu("fault", "add", "device-down", device, "--state-file", str(mini.path))
    assert added.returncode == 0, added.stderr
    try:
        Select(browser.find_element("id", "metric")).select_by_value("utilization")
        WebDriverWait(browser, FAULT_SHOWS_S, poll_frequency=0.05).until(
            lambda d: _dies_in_page(d)[die_id(device, 0)]["colour"] == RED
        )
        healthy = _dies_in_page(browser)[die_id("n00-npu0", 0)]["colour"]
        assert healthy not in (RED, "")  # a ramp colour, not the health green
        Select(browser.find_element("id", "metric")).select_by_value("health")
    finally:
        run_cmemu("fault", "rm", f"dev:{device}", "--state-file", str(mini.path))


async def test_snapshot_and_server_sent_events(mini: state.Instance) -> None:
    url = mini.launcher.ui
    assert url is not None
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "api/snapshot") as response:
            assert response.status == 200
            doc = await response.json()
        assert set(doc["devices"]) == {d.id for d in mini.topology.devices}
        assert doc["preset"] == "cm-mini"
        assert set(doc["planes"]) == {str(p) for p in range(7)}
        for missing in ("static/nothing.js", "static/index.html", "nothing"):
            async with session.get(url + missing) as response:
                assert response.status == 404
        async with session.get(url + "static/app.js") as response:
            assert response.status == 200
            assert "EventSource" in await response.text()

        async with session.get(url + "events") as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            first = await next_sse_event(response)
            assert first[0] == "snapshot"
            assert len(first[1]["devices"]) == len(mini.topology.devices)
            device = "n00-npu2"
            added = await asyncio.to_thread(
                run_cmemu, "fault", "add", "device-down", device, "--state-file", str(mini.path)
            )
            assert added.returncode == 0, added.stderr
            try:
                while True:
                    event, data = await asyncio.wait_for(next_sse_event(response), 30)
                    assert event == "diff"
                    if data.get("devices", {}).get(device, {}).get("health") == "NOT_SERVING":
                        break
            finally:
                await asyncio.to_thread(
                    run_cmemu, "fault", "rm", f"dev:{device}", "--state-file", str(mini.path)
                )


def test_ui_none_serves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none.json"
    port = free_port_block(MINI_PORTS)
    output: list[str] = []
    with cmemu_up(
        path,
        "--base-port",
        str(port),
        "--preset",
        "cm-mini",
        "--broker",
        "none",
        "--ui",
        "none",
        output=output,
    ):
        instance = state.read_instance(path)
        assert instance.launcher.ui is None
        status = run_cmemu("status", "--state-file", str(path))
        assert "web view   none" in status.stdout
        assert (
            json.loads(run_cmemu("status", "--json", "--state-file", str(path)).stdout)["ui"]
            is None
        )
    assert "web view    none (--ui none)" in output[0]


def test_status_and_summary_show_the_url(tmp_path: Path) -> None:
    path = tmp_path / "url.json"
    port, ui = free_port_block(MINI_PORTS), free_port_block(1, start=30000)
    output: list[str] = []
    with cmemu_up(
        path,
        "--base-port",
        str(port),
        "--preset",
        "cm-mini",
        "--broker",
        "none",
        "--ui",
        f"127.0.0.1:{ui}",
        output=output,
    ):
        url = f"http://127.0.0.1:{ui}/"
        assert state.read_instance(path).launcher.ui == url
        assert f"web view   {url}" in run_cmemu("status", "--state-file", str(path)).stdout
    assert f"web view    {url}" in output[0]


# --- every mode, every size -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "procs"),
    [
        ("cm384", False),
        pytest.param(
            "cm-mini",
            True,
            marks=pytest.mark.xdist_group("loopback-procs"),  # see tests/conftest.py
        ),
    ],
    ids=["cm384-inprocess", "cm-mini-procs"],
)
def test_every_die_and_a_fault_in_big_and_process_modes(
    browser: Any, tmp_path: Path, preset: str, procs: bool
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / f"{preset}.json"
    topology = build(preset)
    port = free_port_block(server_count(topology))  # procs: the port of every device
    mode = (
        Procs(plan=LoopbackPlan(port=port)) if procs else InProcess(plan=PortPlan(base_port=port))
    )
    options = LaunchOptions(preset=preset, mode=mode, metrics=not procs)
    with hosted_instance(options, path, ui="127.0.0.1:0", timeout_s=300) as instance:
        _open(browser, instance)
        assert len(_dies_in_page(browser)) == 2 * len(topology.of_kind(DeviceKind.NPU))
        device = topology.of_kind(DeviceKind.NPU)[-1].id
        added = run_cmemu("fault", "add", "device-down", device, "--state-file", str(path))
        assert added.returncode == 0, added.stderr
        WebDriverWait(browser, FAULT_SHOWS_S, poll_frequency=0.05).until(
            lambda d: _dies_in_page(d)[die_id(device, 1)]["colour"] == RED
        )
        # the embedded broker's events reach the timeline too
        WebDriverWait(browser, 30, poll_frequency=0.2).until(
            lambda d: any(
                device in x.text for x in d.find_elements("css selector", "#events li.ev-fault")
            )
        )


# --- what the view asks of the fabric ---------------------------------------------------------


async def test_the_link_feeds_ask_the_fabric_only_while_a_page_is_open() -> None:
    """Issue 18: the L2 sub-plane feed's full link list (cm384: 25,000 links every 8.4 s) cost
    the server 14-20% of its CPU in bursts, with no page open. Counted at the fabric of a real
    in-process supernode: no link-stats table while no page listens, however fast the feeds; a
    page (an /events stream) gets the planes (a link cut shows on its plane); once it closes,
    the asking stops."""
    fast = Rates(links_interval_s=0.05, planes_min_interval_s=0.05, publish_interval_s=0.05)
    async with running_supernode("cm-mini") as sn:
        fabric = sn.local.fabric
        assert fabric is not None
        planes = plane_of_links(sn.topology)
        cut = next(x for x in sn.topology.links if planes.get(f"{x.a}>{x.b}") == 3)
        async with WebView(sn.clients, rates=fast) as view, aiohttp.ClientSession() as session:
            await asyncio.sleep(1.0)  # 20 periods of either feed
            assert fabric.link_tables == 0
            async with session.get(view.url + "api/snapshot") as response:
                idle = (await response.json())["sources"]
            assert idle["planes"] == idle["links"] == IDLE
            await sn.clients.fabric().InjectFault(
                fabric_pb2.FabricFault(kind="link-down", target=f"{cut.a}~{cut.b}")
            )
            async with session.get(view.url + "events") as response:
                while True:
                    _, data = await asyncio.wait_for(next_sse_event(response), 30)
                    if data.get("planes", {}).get("3", {}).get("links_down") == 2:  # both ways
                        break
            assert fabric.link_tables > 0
            assert data["planes"]["0"]["links_down"] == 0
            await asyncio.sleep(0.5)  # the page's stream ended: the feeds' last tables
            asked = fabric.link_tables
            await asyncio.sleep(1.0)
            assert fabric.link_tables == asked
