"""Telemetry and events to MQTT: `cmemu/<supernode>/<device>/telemetry` and `.../events`.

One EventBus per process serves all its devices over one broker connection (aiomqtt), or, when
the broker is the embedded one of this very process, by handing it each message (no connection:
emulator/runtime/broker.py `in_process`). Events
(started, health, fault, stopped) go at QoS 1 and are buffered while the broker is away, up to a
bound, and leave the buffer only once the broker has acknowledged them. Telemetry goes at QoS 0
and is not buffered: a newer sample replaces it. A broker that is down or unreachable never stops
a device: it says so in its logs and in its telemetry (broker_connected, events_pending,
events_dropped), and reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.runtime.broker import Broker, in_process

if TYPE_CHECKING:
    import aiomqtt

log = structlog.get_logger("cmemu.events")
EVENTS_QOS = 1
TELEMETRY_QOS = 0
PUBLISH_TIMEOUT_S = 5.0
LOCAL_BATCH = 64  # messages handed to a broker in this process between two yields to the loop


def parse_broker_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "mqtt" or not parts.hostname:
        raise InvalidArgumentError(f"broker URL {url!r} must look like mqtt://HOST:PORT")
    try:
        return parts.hostname, parts.port or 1883
    except ValueError as exc:
        raise InvalidArgumentError(f"broker URL {url!r}: {exc}") from exc


def topic(supernode: str, device: str, stream: str) -> str:
    return f"cmemu/{supernode}/{device}/{stream}"


SUBSCRIBER_EXIT_S = 2.0  # how long a subscriber's disconnect may take on the way out


class _LateAck(logging.Filter):
    """aiomqtt logs a SUBACK for a subscribe it no longer waits for (one cancelled by a stop)
    as an exception, traceback and all: a late answer to a question nobody asks any more."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unexpected message ID")


_SUBSCRIBER_LOG = logging.getLogger("cmemu.mqtt.subscriber")
_SUBSCRIBER_LOG.addFilter(_LateAck())


@contextlib.asynccontextmanager
async def subscriber(host: str, port: int, **kwargs: Any) -> AsyncIterator[aiomqtt.Client]:
    """An aiomqtt client for a reader that is cancelled to stop (the web view, `cmemu watch`).
    aiomqtt's exit waits for the broker to acknowledge the disconnect with no timeout: after a
    cancellation nothing ends that wait, and the reader's owner hangs in its shutdown. Here the
    exit gets SUBSCRIBER_EXIT_S and is then abandoned (the socket closes with the process)."""
    import aiomqtt  # here, not at the top: see EventBus._run

    client = aiomqtt.Client(host, port, logger=_SUBSCRIBER_LOG, **kwargs)
    await client.__aenter__()
    try:
        yield client
    finally:
        with contextlib.suppress(TimeoutError, aiomqtt.MqttError):
            async with asyncio.timeout(SUBSCRIBER_EXIT_S):
                await client.__aexit__(None, None, None)


@dataclass(frozen=True)
class _Message:
    """One MQTT message waiting to be published."""

    topic: str
    payload: bytes
    qos: int


class EventBus:
    def __init__(
        self,
        url: str,
        supernode: str,
        *,
        buffer_max: int = 10_000,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.url = url
        self._login = (username, password)  # the broker's user, when it wants one
        self.host, self.port = parse_broker_url(url)
        self.supernode = supernode
        self.connected = False
        self.dropped = 0
        self.last_error = ""
        self._pending: deque[_Message] = deque()  # events, oldest first
        # the newest telemetry sample per device: a newer one replaces it, and samples never
        # take an event's place in the bounded buffer
        self._samples: dict[str, _Message] = {}
        self._buffer_max = buffer_max
        self._nonempty = asyncio.Event()
        self._wake = asyncio.Event()  # set on close: ends a reconnect backoff early
        self._drained = asyncio.Event()
        # set when the buffer of events empties, or when the broker is lost (nothing more
        # leaves for now): what `sent` waits for
        self._sent = asyncio.Event()
        self._tasks: asyncio.TaskGroup | None = None
        self._closing = False
        self._held = False  # a broker-outage fault: stay away from the broker
        self._released = asyncio.Event()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def __aenter__(self) -> EventBus:
        """Start publishing: the publisher is a task of the bus's own TaskGroup."""
        self._tasks = asyncio.TaskGroup()
        await self._tasks.__aenter__()
        self._tasks.create_task(self._run(), name="mqtt-publisher")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
        assert self._tasks is not None
        await self._tasks.__aexit__(None, None, None)  # the publisher ends on close

    def event(self, device: str, event: str, emulated_ns: int, **detail: Any) -> None:
        payload = {
            "device": device,
            "event": event,
            "emulated_ns": emulated_ns,
            "wall": time.time(),
            **detail,
        }
        where = topic(self.supernode, device, "events")
        self._put(_Message(where, json.dumps(payload).encode(), EVENTS_QOS))

    def telemetry(self, device: str, sample: dict[str, Any]) -> None:
        if self.connected:  # a stale sample is worth nothing: never buffered for later
            where = topic(self.supernode, device, "telemetry")
            self._samples.pop(device, None)  # to the back: devices take turns
            self._samples[device] = _Message(where, json.dumps(sample).encode(), TELEMETRY_QOS)
            self._nonempty.set()

    def hold(self, held: bool) -> None:
        """A broker outage as this process sees it (fault kind broker-outage): drop the
        connection and stay away, buffering events, until released."""
        self._held = held
        if held:
            self._sent.set()  # nothing leaves during the outage
            self._released.clear()
            self._nonempty.set()  # wake the publisher, which lets go of the broker
        else:
            self._released.set()

    def _put(self, message: _Message) -> None:
        if len(self._pending) >= self._buffer_max:
            dropped = self._pending.popleft()  # the oldest goes; say so
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("event buffer full", dropped=self.dropped, oldest=dropped.topic)
        self._pending.append(message)
        self._drained.clear()
        self._sent.clear()
        self._nonempty.set()

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            if self._held and not self._closing:
                self.connected = False
                log.warning("broker outage (fault): buffering events", broker=self.url)
                await self._released.wait()
                continue
            local = in_process(self.url)
            if local is not None:
                await self._publish_locally(local)
            elif not await self._publish_over_mqtt():  # the broker is away: back off, again
                if self._closing:
                    return
                with contextlib.suppress(TimeoutError):  # a close ends the wait
                    async with asyncio.timeout(backoff):
                        await self._wake.wait()
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.2
            if self._closing:
                return  # the client disconnected cleanly on the way out
            # else an outage: the client let go of the broker; wait for its end

    async def _publish_over_mqtt(self) -> bool:
        """Publish through one MQTT connection until a close or an outage (True), or until the
        broker is lost (False: said in the log, the buffered events kept)."""
        # imported here, by a process that has a broker of another process: aiomqtt brings
        # paho, and paho urllib.request, http.client and email (about 2 MB of a device
        # process's 30, issue 18); a process without one (`--broker none`, a device process on
        # its own, or one that serves its broker itself) never loads them
        import aiomqtt

        try:
            async with aiomqtt.Client(
                self.host,
                self.port,
                identifier=f"cmemu-{os.getpid()}-{id(self):x}",
                username=self._login[0],
                password=self._login[1],
                timeout=PUBLISH_TIMEOUT_S,
            ) as client:
                self.connected = True
                log.info("broker connected", broker=self.url, pending=len(self._pending))
                while not self._closing and not self._held:
                    if self._pending:  # events first, one acknowledged before the next
                        message = self._pending[0]
                        await client.publish(message.topic, message.payload, qos=message.qos)
                        self._acknowledged(message)
                    elif self._samples:
                        sample = self._samples.pop(next(iter(self._samples)))
                        await client.publish(sample.topic, sample.payload, qos=sample.qos)
                    else:
                        self._nonempty.clear()
                        self._drained.set()
                        await self._nonempty.wait()
        except aiomqtt.MqttError as exc:
            if self.connected or not self.last_error:
                log.warning(
                    "broker unreachable; buffering events",
                    broker=self.url,
                    error=str(exc),
                    pending=len(self._pending),
                )
            self.connected, self.last_error = False, str(exc)
            self._sent.set()  # nothing leaves until the broker is back: no one waits
            self._samples.clear()  # stale by the time the broker is back
            return False
        return True

    def _acknowledged(self, message: _Message) -> None:
        """The broker has `message`: it leaves the buffer (only now), if the buffer has not
        dropped it meanwhile."""
        if self._pending and self._pending[0] is message:
            self._pending.popleft()
        if not self._pending:
            self._sent.set()

    async def _publish_locally(self, broker: Broker) -> None:
        """Hand every message to the broker of this process until a close or an outage, as the
        MQTT client would publish them: events first and in order, each leaving the buffer as
        the broker takes it, then the newest sample of each device. A yield every
        LOCAL_BATCH messages keeps a burst (cm384's 629 `started` events) from holding the loop."""
        self.connected, self.last_error = True, ""
        log.info("broker connected", broker=self.url, pending=len(self._pending), local=True)
        while not self._closing and not self._held:
            for _ in range(LOCAL_BATCH):
                if self._pending:
                    message = self._pending.popleft()
                elif self._samples:
                    message = self._samples.pop(next(iter(self._samples)))
                else:
                    break
                broker.publish(message.topic, message.payload, message.qos)
            else:
                await asyncio.sleep(0)
                continue
            self._nonempty.clear()
            self._drained.set()
            self._sent.set()
            await self._nonempty.wait()
        self.connected = False
        self._sent.set()  # a close or an outage: nothing more leaves for now

    async def sent(self, within_s: float) -> bool:
        """Wait until every event buffered has reached the broker (taken by the broker of this
        process, or acknowledged over MQTT), for at most `within_s` wall seconds, and not at all
        while the broker is away (a broker that is down never stops a device): True once none
        is left.

        Why a start waits for its `started` events: a supernode announces each of its servers
        as it starts serving; published after the start had returned, cm384's 629 (QoS 1, one
        acknowledgement each) kept the one event loop busy for the first 0.5-1 s of service,
        where the first paced fabric transfers met them (traced, issue 18)."""
        if not self._pending:
            return True
        if self.connected and not self._held:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within_s):
                    while self._pending and self.connected and not self._held:
                        self._sent.clear()
                        await self._sent.wait()
        return not self._pending

    async def close(self, flush_s: float = 1.0) -> None:
        """Give the last events (the `stopped` ones) a moment to leave, then let the publisher
        finish: an in-flight QoS 1 publish completes (or times out in aiomqtt after
        PUBLISH_TIMEOUT_S) and the client disconnects cleanly. Cancelling aiomqtt mid-publish can
        leave its exit waiting on an acknowledgement forever, so nothing here cancels."""
        if self._pending and self.connected:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(flush_s):
                    await self._drained.wait()
        self._closing = True
        self._released.set()
        self._nonempty.set()
        self._wake.set()
