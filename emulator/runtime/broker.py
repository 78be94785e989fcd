"""The embedded MQTT broker: what `cmemu up` serves events on when no broker is given.

A small MQTT 3.1.1 broker on asyncio, enough for telemetry and events: CONNECT, PUBLISH at QoS 0,
1 and 2 (acknowledged as the protocol requires), SUBSCRIBE with + and # wildcards (granted at
most QoS 1), retained messages, UNSUBSCRIBE, PINGREQ, DISCONNECT. No persistence. With a login
(the emulator's token configured: `Security.mqtt_login`) a CONNECT without that username and
password is refused (CONNACK 5, not authorized) and the connection closed: on loopback or not,
whoever may not call a state-changing RPC may not forge a device's `died` event either. Without
one it is open, like the loopback servers. Compose deployments and CI use mosquitto.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

import structlog

log = structlog.get_logger("cmemu.broker")

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
MAX_PACKET = 1 << 20
NOT_AUTHORIZED = 5  # CONNACK return code (MQTT 3.1.1 section 3.2.2.3)
USERNAME_FLAG, PASSWORD_FLAG, WILL_FLAG = 0x80, 0x40, 0x04

_IN_PROCESS: dict[str, Broker] = {}  # the brokers this process serves, by URL


def in_process(url: str) -> Broker | None:
    """The embedded broker serving `url` in this process, if any: a publisher of this process
    hands it each message (Broker.publish) with no MQTT client, connection or acknowledgement
    (emulator/runtime/events.py). Issue 18: cm384's 629 `started` events, each a QoS 1
    round trip through a client and this broker on the one event loop, kept it busy for the
    first second of service."""
    return _IN_PROCESS.get(url)


class ProtocolError(Exception):
    pass


class NotAuthorizedError(Exception):
    """A CONNECT without the broker's login: answered CONNACK 5, then the connection closes."""


def topic_matches(pattern: str, topic: str) -> bool:
    """MQTT filter matching: + is one level, # is the rest (including none)."""
    p, t = pattern.split("/"), topic.split("/")
    for i, part in enumerate(p):
        if part == "#":
            return True
        if i >= len(t) or (part != "+" and part != t[i]):
            return False
    return len(p) == len(t)


def _string(data: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _binary(data, pos)
    return raw.decode(), pos


def _binary(data: bytes, pos: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("!H", data, pos)
    if pos + 2 + length > len(data):
        raise ProtocolError("a field runs past the end of its packet")
    return data[pos + 2 : pos + 2 + length], pos + 2 + length


def _encode_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def _packet(kind: int, flags: int, body: bytes) -> bytes:
    length, encoded = len(body), bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes([kind << 4 | flags]) + bytes(encoded) + body


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    header = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    for _ in range(4):
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        raise ProtocolError("malformed remaining length")
    if length > MAX_PACKET:
        raise ProtocolError(f"packet of {length} bytes exceeds {MAX_PACKET}")
    return header >> 4, header & 0x0F, await reader.readexactly(length)


@dataclass(eq=False)
class _Session:
    """One MQTT client's session with the embedded broker: its subscriptions and packet ids."""

    writer: asyncio.StreamWriter
    client_id: str = ""
    subscriptions: dict[str, int] = field(default_factory=dict)
    next_id: int = 1

    def granted(self, topic: str) -> int:
        """The QoS of the best matching subscription, or -1 when none matches."""
        return max(
            (q for p, q in self.subscriptions.items() if topic_matches(p, topic)), default=-1
        )

    def packet_id(self) -> int:
        self.next_id = self.next_id % 65535 + 1
        return self.next_id


class Broker:
    """`async with Broker(host, port) as broker:` serves until the block ends. `login`, a
    {"username": ..., "password": ...} as `Security.mqtt_login` gives it (empty: none), is what
    every client must present."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, login: Mapping[str, str] | None = None
    ) -> None:
        self.host = host
        self.port = port
        self._login: tuple[bytes, bytes] | None = None
        if login:
            self._login = (login["username"].encode(), login["password"].encode())
        self.refused = 0  # CONNECTs refused for want of the login
        self._sessions: set[_Session] = set()
        self._retained: dict[str, tuple[bytes, int]] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers = {
            PUBLISH: self._publish,
            PUBREL: self._pubrel,
            SUBSCRIBE: self._subscribe,
            UNSUBSCRIBE: self._unsubscribe,
            PINGREQ: self._ping,
            PUBACK: self._ack,
            PUBREC: self._ack,
            PUBCOMP: self._ack,
        }

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def clients(self) -> int:
        """MQTT clients connected now (a publisher of this process is none of them)."""
        return len(self._sessions)

    async def __aenter__(self) -> Broker:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        _IN_PROCESS[self.url] = self
        log.info("broker serving", url=self.url)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if _IN_PROCESS.get(self.url) is self:
            del _IN_PROCESS[self.url]
        if self._server is not None:
            self._server.close()
        for session in list(self._sessions):
            session.writer.close()  # their readers end, and with them their tasks
        if self._tasks:
            _, late = await asyncio.wait(list(self._tasks), timeout=2.0)
            for task in late:
                task.cancel()
        if self._server is not None:
            # Python 3.11's wait_closed also waits for every connection to detach: bounded, so
            # that a client that never says goodbye cannot hold a shutdown forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        session = _Session(writer=writer)
        try:
            kind, _, body = await _read_packet(reader)
            if kind != CONNECT:
                raise ProtocolError("first packet must be CONNECT")
            try:
                session.client_id = self._connect(body)
            except NotAuthorizedError as exc:
                self.refused += 1
                log.warning(
                    "client refused", reason=str(exc), peer=writer.get_extra_info("peername")
                )
                writer.write(_packet(CONNACK, 0, bytes([0, NOT_AUTHORIZED])))
                await writer.drain()
                return
            writer.write(_packet(CONNACK, 0, b"\x00\x00"))
            self._sessions.add(session)
            while True:
                kind, flags, body = await _read_packet(reader)
                if kind == DISCONNECT:
                    break
                await self._handle(session, kind, flags, body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except (ProtocolError, UnicodeDecodeError, struct.error, IndexError) as exc:
            log.info("client dropped", client=session.client_id, error=str(exc))
        except asyncio.CancelledError:
            pass  # shutting down: end quietly (asyncio's stream callback trips on a cancelled task)
        finally:
            self._sessions.discard(session)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._tasks.discard(task)

    def _connect(self, body: bytes) -> str:
        protocol, pos = _string(body, 0)
        if protocol not in ("MQTT", "MQIsdp"):
            raise ProtocolError(f"not MQTT: {protocol!r}")
        flags = body[pos + 1]
        pos += 4  # level, flags, keepalive
        client_id, pos = _string(body, pos)
        if flags & WILL_FLAG:
            _, pos = _string(body, pos)  # the will's topic
            _, pos = _binary(body, pos)  # and message
        username = password = None
        if flags & USERNAME_FLAG:
            username, pos = _binary(body, pos)
        if flags & PASSWORD_FLAG:
            password, pos = _binary(body, pos)
        if self._login is not None:
            if username is None or password is None:
                raise NotAuthorizedError("no username and password (this broker wants a login)")
            # both compared, in constant time: a refusal says nothing of which was wrong
            user_ok = hmac.compare_digest(username, self._login[0])
            if not (hmac.compare_digest(password, self._login[1]) and user_ok):
                raise NotAuthorizedError("wrong username or password")
        return client_id

    async def _handle(self, session: _Session, kind: int, flags: int, body: bytes) -> None:
        handler = self._handlers.get(kind)
        if handler is None:
            raise ProtocolError(f"unexpected packet type {kind}")
        handler(session, flags, body)

    def _publish(self, session: _Session, flags: int, body: bytes) -> None:
        qos, retain = (flags >> 1) & 3, flags & 1
        topic, pos = _string(body, 0)
        if qos:
            pos += 2  # the packet id, echoed in the acknowledgement below
        payload = body[pos:]
        if retain:
            if payload:
                self._retained[topic] = (payload, min(qos, 1))
            else:
                self._retained.pop(topic, None)
        self._route(topic, payload, min(qos, 1))
        if qos:  # QoS 1: PUBACK; QoS 2: PUBREC, then PUBREL/PUBCOMP
            session.writer.write(_packet(PUBACK if qos == 1 else PUBREC, 0, body[pos - 2 : pos]))

    def _pubrel(self, session: _Session, flags: int, body: bytes) -> None:
        session.writer.write(_packet(PUBCOMP, 0, body[:2]))

    def _subscribe(self, session: _Session, flags: int, body: bytes) -> None:
        pos, granted = 2, bytearray()
        while pos < len(body):
            pattern, pos = _string(body, pos)
            session.subscriptions[pattern] = min(body[pos], 1)
            granted.append(session.subscriptions[pattern])
            pos += 1
        session.writer.write(_packet(SUBACK, 0, body[:2] + bytes(granted)))
        for topic, (payload, qos) in self._retained.items():
            best = session.granted(topic)
            if best >= 0:
                self._send(session, topic, payload, min(qos, best), retain=True)

    def _unsubscribe(self, session: _Session, flags: int, body: bytes) -> None:
        pos = 2
        while pos < len(body):
            pattern, pos = _string(body, pos)
            session.subscriptions.pop(pattern, None)
        session.writer.write(_packet(UNSUBACK, 0, body[:2]))

    def _ping(self, session: _Session, flags: int, body: bytes) -> None:
        session.writer.write(_packet(PINGRESP, 0, b""))

    def _ack(self, session: _Session, flags: int, body: bytes) -> None:
        """Acknowledgements of what we sent: no retries, so nothing to settle."""

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        """A message from a publisher in this process, as if it came in a PUBLISH (no retain):
        its subscribers get it at once, and it is the broker's as a QoS 1 PUBACK would say."""
        self._route(topic, payload, min(qos, 1))

    def _route(self, topic: str, payload: bytes, qos: int) -> None:
        for session in list(self._sessions):
            best = session.granted(topic)
            if best >= 0:
                self._send(session, topic, payload, min(qos, best))

    def _send(
        self, session: _Session, topic: str, payload: bytes, qos: int, *, retain: bool = False
    ) -> None:
        body = _encode_string(topic)
        if qos:
            body += struct.pack("!H", session.packet_id())
        flags = (qos << 1) | int(retain)
        try:
            session.writer.write(_packet(PUBLISH, flags, body + payload))
        except (ConnectionError, RuntimeError):
            self._sessions.discard(session)
