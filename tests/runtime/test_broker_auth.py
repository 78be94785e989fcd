"""Issue 21 finding 6: with a token, the embedded broker wants the instance's login. Driven by
the real mosquitto_pub and mosquitto_sub (Debian's mosquitto-clients), as an attacker on the
host would: an anonymous or wrong-password client is refused (CONNACK 5, not authorised) and
its forged `died` event reaches no one; the logged-in clients (devices, `cmemu watch`, the web
view) work. Without a token the broker stays open."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from cmemu.emulator.runtime import state
from cmemu.emulator.runtime.broker import Broker
from cmemu.emulator.runtime.events import parse_broker_url
from cmemu.emulator.runtime.security import MQTT_USER, Security, mqtt_password
from cmemu.emulator.testing import CMEMU, MINI_PORTS, cmemu_up, free_port_block, grpcurl
from tests.runtime.test_metrics import parse, scrape, value

TOKEN = "broker-test-token-0123456789"
LOGIN = {"username": MQTT_USER, "password": mqtt_password(TOKEN)}
FORGED = '{"device": "n00-npu0", "event": "died", "exit_code": 9}'
DEVICE_EVENTS = "cmemu/sn0/n00-npu0/events"
WAIT_S = 60.0  # bounds a hung test; on a busy host every step below takes far less

pytestmark = pytest.mark.skipif(
    shutil.which("mosquitto_sub") is None or shutil.which("mosquitto_pub") is None,
    reason="mosquitto-clients is not installed (apt-get install mosquitto-clients)",
)


def _login_args(login: dict[str, str] | None) -> list[str]:
    return ["-u", login["username"], "-P", login["password"]] if login else []


async def publish(url: str, payload: str, login: dict[str, str] | None) -> tuple[int, str]:
    """`mosquitto_pub` of one QoS 1 message: (exit code, what it said)."""
    host, port = parse_broker_url(url)
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_pub",
        *("-h", host, "-p", str(port), "-q", "1", "-t", DEVICE_EVENTS, "-m", payload),
        *_login_args(login),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


class Subscriber:
    """`mosquitto_sub -d -v` on every device's events: its debug lines say when it is
    subscribed; its message lines (`TOPIC PAYLOAD`) are kept."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.messages: list[tuple[str, str]] = []
        self.said: list[str] = []

    async def subscribed(self) -> None:
        assert self.proc.stdout is not None
        async with asyncio.timeout(WAIT_S):
            while True:
                line = (await self.proc.stdout.readline()).decode()
                self.said.append(line)
                if not line:
                    raise AssertionError(f"mosquitto_sub ended: {''.join(self.said)}")
                if "received SUBACK" in line:
                    return

    async def next_message(self) -> tuple[str, str]:
        """The next message line (debug lines skipped); an AssertionError saying what was seen
        when none comes within WAIT_S."""
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(WAIT_S):
                while True:
                    line = (await self.proc.stdout.readline()).decode()
                    self.said.append(line)
                    if not line:
                        raise AssertionError(f"mosquitto_sub ended: {''.join(self.said)}")
                    if line.startswith("cmemu/"):
                        where, payload = line.rstrip("\n").split(" ", 1)
                        self.messages.append((where, payload))
                        return where, payload
        except TimeoutError:
            raise AssertionError(f"no message in {WAIT_S} s; saw {''.join(self.said)}") from None


@contextlib.asynccontextmanager
async def subscriber(url: str, login: dict[str, str] | None) -> AsyncIterator[Subscriber]:
    host, port = parse_broker_url(url)
    proc = await asyncio.create_subprocess_exec(
        *("stdbuf", "-oL", "mosquitto_sub"),  # its debug lines block-buffered in a pipe otherwise
        *("-d", "-v", "-h", host, "-p", str(port), "-q", "1", "-t", "cmemu/+/+/events"),
        *_login_args(login),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        yield Subscriber(proc)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), WAIT_S)


async def every_process_logged_in(metrics: dict[str, str]) -> None:
    """Every process of the instance (devices', and the services' with the manager and the
    scheduler) has its event publisher connected: logged in, since the broker refuses anyone
    else. Polled: each connects in the background."""
    assert metrics
    for process, url in metrics.items():
        try:
            async with asyncio.timeout(WAIT_S):
                while True:
                    if value(parse(await scrape(url)), "cmemu_mqtt_connected") == 1:
                        break
                    await asyncio.sleep(0.2)  # not yet, or refused (it tries again, refused)
        except TimeoutError:
            raise AssertionError(f"{process}'s events never reached the broker ({url})") from None


async def timeline_after_a_fault(ui: str | None) -> list[dict[str, object]]:
    """The web view's events once the device's `fault` is among them."""
    assert ui is not None
    async with aiohttp.ClientSession() as session, asyncio.timeout(WAIT_S):
        while True:
            async with session.get(ui + "api/snapshot") as response:
                events: list[dict[str, object]] = (await response.json())["events"]
            if any(e["event"] == "fault" for e in events):
                return events
            await asyncio.sleep(0.2)


async def refused_subscriber(url: str, login: dict[str, str] | None) -> str:
    """A mosquitto_sub that must be refused: what it said (it exits non-zero)."""
    async with subscriber(url, login) as sub:
        assert sub.proc.stdout is not None
        out = await asyncio.wait_for(sub.proc.stdout.read(), WAIT_S)
        await asyncio.wait_for(sub.proc.wait(), WAIT_S)
        assert sub.proc.returncode != 0, out
        return out.decode()


async def test_the_broker_refuses_anonymous_and_wrong_logins() -> None:
    async with Broker(login=LOGIN) as broker, subscriber(broker.url, LOGIN) as sub:
        await sub.subscribed()
        for login in (
            None,
            {"username": MQTT_USER, "password": "guess"},
            {**LOGIN, "username": "x"},
        ):
            code, said = await publish(broker.url, FORGED, login)
            assert code != 0 and "not authorised" in said.lower(), (login, code, said)
            said = await refused_subscriber(broker.url, login)
            assert "not authorised" in said.lower(), said
        assert broker.refused == 6
        # the logged-in publisher gets through, and the first message the subscriber sees is
        # its, not the forged one
        code, said = await publish(broker.url, '{"event": "genuine"}', LOGIN)
        assert code == 0, said
        assert await sub.next_message() == (DEVICE_EVENTS, '{"event": "genuine"}')


def test_the_broker_password_is_not_the_token() -> None:
    """Derived from the token (so every process holding it logs in), one way, and per token."""
    login = Security(token=TOKEN, mqtt_user=MQTT_USER).mqtt_login()
    assert login == LOGIN and TOKEN not in login["password"]
    assert mqtt_password(TOKEN + "x") != login["password"]


async def test_without_a_login_the_broker_is_open() -> None:
    """The must-pass twin's opposite: the same anonymous publish, no login configured, arrives
    (so the refusal above is the login's doing, not a broken client)."""
    async with Broker() as broker, subscriber(broker.url, None) as sub:
        await sub.subscribed()
        code, said = await publish(broker.url, FORGED, None)
        assert code == 0, said
        assert await sub.next_message() == (DEVICE_EVENTS, FORGED)
        assert broker.refused == 0


@pytest.mark.parametrize(
    "mode",
    ["inprocess", pytest.param("procs", marks=pytest.mark.xdist_group("loopback-procs"))],
)
async def test_an_instance_with_a_token_refuses_a_forged_died(tmp_path: Path, mode: str) -> None:
    """`cmemu up --token-file`: a forged `died` never reaches a logged-in subscriber, `cmemu
    watch` or the web view's timeline; a real event from a device (logged in: in procs mode a
    process given the login through its environment) reaches all three. Every process's
    publisher, the services' (manager, scheduler) too, is connected, so logged in."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    path = tmp_path / "auth.json"
    if mode == "procs":  # every device on a loopback address of its own, at this port
        place = ["--mode", "procs", "--per", "node", "--port", str(free_port_block(1))]
    else:
        place = ["--base-port", str(free_port_block(MINI_PORTS))]
    args = ("--preset", "cm-mini", *place, "--token-file", str(token_file))
    with cmemu_up(path, *args, quiet=True):
        instance = state.read_instance(path)
        url = instance.topology.broker
        assert url is not None and instance.launcher.extra["mqtt_user"] == MQTT_USER
        assert state.mqtt_login(path) == LOGIN
        assert "not authorised" in (await refused_subscriber(url, None)).lower()
        # nor does the token log in: MQTT here has no TLS, and what crosses its wire must not
        # open the gRPC services (the password is derived from the token, one way)
        with_token = {"username": MQTT_USER, "password": TOKEN}
        assert "not authorised" in (await refused_subscriber(url, with_token)).lower()
        await every_process_logged_in(instance.launcher.metrics)
        watch = await asyncio.create_subprocess_exec(
            CMEMU,
            *("watch", "--state-file", str(path), "--count", "1", "--json", "--ready"),
            *("--device", instance.topology.devices[0].id),  # not the manager's incident
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert watch.stdout is not None
        try:
            ready = await asyncio.wait_for(watch.stdout.readline(), WAIT_S)
            assert ready.decode().strip() == "watching", ready
            async with subscriber(url, LOGIN) as sub:
                await sub.subscribed()
                code, said = await publish(url, FORGED, None)
                assert code != 0 and "not authorised" in said.lower(), said
                npu = instance.topology.devices[0]
                code, _, err = await grpcurl(
                    *("-H", f"authorization: Bearer {TOKEN}"),
                    *("-d", '{"faulted": true, "reason": "genuine"}'),
                    *(npu.address, "cmemu.v1.Device/SetFaultState"),
                )
                assert code == 0, err
                where, payload = await sub.next_message()
                # the manager's incident and the scheduler's `failed` for it may come first
                while where in ("cmemu/sn0/manager/events", "cmemu/sn0/scheduler/events"):
                    where, payload = await sub.next_message()
                assert where == f"cmemu/sn0/{npu.id}/events", payload
                assert json.loads(payload)["event"] == "fault", payload
            watched, _ = await asyncio.wait_for(watch.communicate(), WAIT_S)
            assert watch.returncode == 0
            assert json.loads(watched)["reason"] == "genuine", watched
        finally:
            if watch.returncode is None:
                watch.kill()
                await watch.wait()
        events = await timeline_after_a_fault(instance.launcher.ui)
        assert not [e for e in events if e["event"] == "died"], events
