"""A reusable fuzz harness for the emulator's gRPC services (issue 9 item 2).

`messages(cls)` is a Hypothesis strategy for any protobuf message class, built from its
descriptor: random and boundary values of every field (huge and negative integers, NaN and
infinite floats, long and invalid names, empty messages, unknown enum numbers, repeated fields of
10^4..10^5 entries where cheap). `corrupt_bodies()` gives raw bytes that are not a valid body.
`FuzzTarget` runs a real supernode (cm-mini) in a thread of its own, so that plain synchronous
Hypothesis tests can call it over real gRPC; `Fuzzer` sends calls and checks the properties:
never UNKNOWN nor INTERNAL, never a hang. The EMS engineer can reuse all of it for Ems.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from cmemu.emulator.model.hardware import HardwareProfile
from cmemu.emulator.runtime.supernode import Supernode
from cmemu.emulator.testing import running_supernode

FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
CALL_TIMEOUT_S = 10.0  # a reply later than this is a hang
LONG = "n" * 20_000  # over grpc's 16 KiB metadata limit once echoed

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def integers(lo: int, hi: int, hints: Sequence[int] = ()) -> st.SearchStrategy[int]:
    """Boundaries (0, 1, the extremes, powers of two, the caller's hints) and anything between."""
    edges = {0, 1, lo, hi, hi - 1, *(v for k in (8, 12, 20, 30, 32, 40, 63) for v in (2**k,))}
    edges |= {-1, lo + 1} if lo < 0 else set()
    edges |= set(hints)
    edges = {v for v in edges if lo <= v <= hi}
    return st.one_of(st.sampled_from(sorted(edges)), st.integers(lo, hi))


def floats(width: Literal[16, 32, 64] = 64) -> st.SearchStrategy[float]:
    edges = [0.0, -0.0, 1.0, -1.0, 1e30, -1e30, 1e300, float("nan"), float("inf"), float("-inf")]
    if width == 32:
        edges = [e for e in edges if not math.isfinite(e) or abs(e) < 3e38]
    return st.one_of(st.sampled_from(edges), st.floats(width=width))


def strings(names: Sequence[str] = ()) -> st.SearchStrategy[str]:
    parts: list[st.SearchStrategy[str]] = [
        st.sampled_from(["", LONG, LONG + ".d1", "\x00", "a~b", "a>b", "é" * 3000]),
        st.text(max_size=24),
    ]
    if names:
        parts.insert(0, st.sampled_from(list(names)))
    return st.one_of(*parts)


def binaries() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from([b"", b"x" * ((1 << 20) + 1), b"\x00" * 8]), st.binary(max_size=64)
    )


@dataclass(frozen=True, kw_only=True)
class Hints:
    """What makes a random message likely to reach deep code: known names and numbers."""

    names: Sequence[str] = ()  # device ids, dies, link names
    ints: Sequence[int] = ()  # EIDs, offsets of regions, sizes
    huge_repeats: bool = True  # repeated fields of 10^4..10^5 entries, sometimes


def _scalar(f: FieldDescriptor, hints: Hints) -> st.SearchStrategy[Any]:  # noqa: PLR0911
    if f.type in _INT_RANGES:
        return integers(*_INT_RANGES[f.type], hints.ints)
    if f.type == FieldDescriptor.TYPE_DOUBLE:
        return floats(64)
    if f.type == FieldDescriptor.TYPE_FLOAT:
        return floats(32)
    if f.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if f.type == FieldDescriptor.TYPE_STRING:
        return strings(hints.names)
    if f.type == FieldDescriptor.TYPE_BYTES:
        return binaries()
    if f.type == FieldDescriptor.TYPE_ENUM:
        assert f.enum_type is not None
        known = [v.number for v in f.enum_type.values]
        return st.one_of(st.sampled_from(known), st.sampled_from([-1, 99, 2**31 - 1]))
    raise TypeError(f"no strategy for field type {f.type}")  # pragma: no cover


def _repeated(f: FieldDescriptor) -> bool:
    flag = getattr(f, "is_repeated", None)  # protobuf >= 6; `label` before
    return bool(flag) if flag is not None else cast(Any, f).label == FieldDescriptor.LABEL_REPEATED


def _field(f: FieldDescriptor, hints: Hints, depth: int) -> st.SearchStrategy[Any] | None:
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        sub = f.message_type
        if sub is None or sub.GetOptions().map_entry or depth <= 0:
            return None
        one: st.SearchStrategy[Any] = _message(sub, hints, depth - 1)
    else:
        one = _scalar(f, hints)
    if not _repeated(f):
        return one
    small = st.lists(one, max_size=4)
    if not hints.huge_repeats or f.type == FieldDescriptor.TYPE_MESSAGE:
        return small
    cheap = one
    if f.type == FieldDescriptor.TYPE_STRING:  # 10^5 copies of a 20 KB name is 2 GB: short ones
        cheap = st.sampled_from(list(hints.names) or ["x"]) if hints.names else st.text(max_size=8)
    elif f.type == FieldDescriptor.TYPE_BYTES:
        cheap = st.binary(max_size=8)
    huge = st.tuples(cheap, st.sampled_from([10_000, 32_000, 100_000])).map(lambda p: [p[0]] * p[1])
    return st.one_of(small, small, small, huge)


def _message(desc: Descriptor, hints: Hints, depth: int) -> st.SearchStrategy[Message]:
    cls = message_factory.GetMessageClass(desc)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        strategy = _field(f, hints, depth)
        if strategy is not None:
            optional[f.name] = strategy

    def build(values: dict[str, Any]) -> Message:
        message = cls()
        for name, value in values.items():
            target = getattr(message, name)
            f = desc.fields_by_name[name]
            if _repeated(f):
                if f.type == FieldDescriptor.TYPE_MESSAGE:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif f.type == FieldDescriptor.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries({}, optional=optional).map(build)


def messages(
    cls: type[Message] | Descriptor, hints: Hints = Hints(), depth: int = 2
) -> st.SearchStrategy[Message]:
    """Random and boundary instances of a message class (or descriptor)."""
    desc = cls if isinstance(cls, Descriptor) else cast(Descriptor, cls.DESCRIPTOR)
    return _message(desc, hints, depth)


def corrupt_bodies() -> st.SearchStrategy[bytes]:
    """Bytes that no message decodes from: bad wire types, truncated varints and lengths,
    strings of invalid UTF-8 (as field 1 and field 3, where most services keep a name)."""
    return st.one_of(
        st.sampled_from(
            [
                b"\xff",
                b"\x08",
                b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
                b"\x0a\x05ab",
                b"\x0a\x02\xff\xfe",
                b"\x1a\x02\xc3\x28",
                b"\x22\x05\x08",
                b"\x07",
                b"\x0f\x00",
            ]
        ),
        st.binary(min_size=1, max_size=32).map(lambda b: b"\x0a" + bytes([len(b)]) + b"\xff" + b),
    )


def methods(service: Any) -> list[MethodDescriptor]:
    """The unary-request methods of a service descriptor (streams of requests excluded)."""
    return [m for m in service.methods if not m.client_streaming]


def request_class(method: MethodDescriptor) -> type[Message]:
    return message_factory.GetMessageClass(method.input_type)


# --- a real supernode in a thread, for synchronous Hypothesis tests ----------------------------


class FuzzTarget:
    """cm-mini running in a thread's event loop; `call` reaches it over real gRPC."""

    def __init__(self, *, profile: HardwareProfile) -> None:
        self.profile = profile
        self.supernode: Supernode | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fuzz-target", daemon=True)
        self._channels: dict[str, grpc.Channel] = {}
        self.codes: collections.Counter[str] = collections.Counter()
        self.calls = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with running_supernode("cm-mini", profile=self.profile) as supernode:
                self.supernode = supernode
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()

    def start(self) -> FuzzTarget:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None or self.supernode is None:
            raise RuntimeError("the fuzz target did not start") from self._error
        return self

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    @property
    def topology(self) -> Any:
        assert self.supernode is not None
        return self.supernode.topology

    def address(self, server: str) -> str:
        for entry in (*self.topology.devices, *self.topology.services):
            if entry.id == server:
                return str(entry.address)
        raise KeyError(server)

    def channel(self, server: str) -> grpc.Channel:
        if server not in self._channels:
            self._channels[server] = grpc.insecure_channel(
                self.address(server),
                options=[("grpc.max_receive_message_length", 64 << 20)],
            )
        return self._channels[server]

    def call(
        self,
        server: str,
        service: str,
        method: str,
        request: Message | bytes,
        *,
        response: type[Message] | None = None,
        stream: bool = False,
    ) -> tuple[grpc.StatusCode, Any]:
        """One call; (code, reply). Never raises on a status: the caller judges it."""
        path = f"/{service}/{method}"
        raw = isinstance(request, bytes)
        channel = self.channel(server)
        deserialize = None if response is None else response.FromString
        self.calls += 1
        try:
            if stream:
                call = channel.unary_stream(
                    path,
                    request_serializer=None if raw else _serialize,
                    response_deserializer=deserialize,
                )
                replies = call(request, timeout=CALL_TIMEOUT_S)
                first = next(iter(replies), None)
                replies.cancel()  # type: ignore[no-untyped-call]
                code, reply = grpc.StatusCode.OK, first
            else:
                unary = channel.unary_unary(
                    path,
                    request_serializer=None if raw else _serialize,
                    response_deserializer=deserialize,
                )
                code, reply = grpc.StatusCode.OK, unary(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            code, reply = exc.code(), exc.details()
        self.codes[code.name] += 1
        return code, reply

    def call_client_stream(
        self, server: str, service: str, method: str, bodies: list[bytes], *, stream: bool
    ) -> tuple[grpc.StatusCode, Any]:
        """A request-streaming call of raw bodies; (code, first reply). Never raises on a
        status. A response stream is cancelled after its first reply."""
        path = f"/{service}/{method}"
        channel = self.channel(server)
        self.calls += 1
        try:
            if stream:
                call = channel.stream_stream(
                    path, request_serializer=None, response_deserializer=None
                )
                replies = call(iter(bodies), timeout=CALL_TIMEOUT_S)
                first = next(iter(replies), None)
                replies.cancel()  # type: ignore[no-untyped-call]
                code, reply = grpc.StatusCode.OK, first
            else:
                unary = channel.stream_unary(
                    path, request_serializer=None, response_deserializer=None
                )
                code, reply = grpc.StatusCode.OK, unary(iter(bodies), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            code, reply = exc.code(), exc.details()
        self.codes[code.name] += 1
        return code, reply

    def health(self, server: str) -> str:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channel(server))
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


@contextmanager
def fuzz_target(profile: HardwareProfile) -> Iterator[FuzzTarget]:
    target = FuzzTarget(profile=profile).start()
    try:
        yield target
    finally:
        target.close()


@dataclass
class Verdict:
    """The properties every call must keep."""

    failures: list[str] = field(default_factory=list)

    def check(self, what: str, code: grpc.StatusCode, reply: Any) -> None:
        if code in FORBIDDEN or code is grpc.StatusCode.DEADLINE_EXCEEDED:
            self.failures.append(f"{what}: {code.name} {str(reply)[:300]}")


Checker = Callable[[FuzzTarget], None]
