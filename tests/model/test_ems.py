"""Property-based: any sequence of puts, gets, deletes and exists against the real EMS service
behaves exactly like a plain dict."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmemu.emulator.model.topology import ServiceKind
from cmemu.emulator.testing import Clients, running_supernode
from cmemu.v1 import ems_pb2, ems_pb2_grpc

T = TypeVar("T")


class Remote:
    """A cm-mini with EMS on an event loop of its own thread, driven from synchronous tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self._start())

    async def _start(self) -> None:
        self._context = running_supernode("cm-mini")
        supernode = await self._context.__aenter__()
        self.clients = Clients(supernode.topology)
        address = supernode.topology.service(ServiceKind.EMS).address
        self.ems = ems_pb2_grpc.EmsStub(self.clients.channel_to(address))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        async def stop() -> None:
            await self.clients.close()
            await self._context.__aexit__(None, None, None)

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def remote() -> Iterator[Remote]:
    r = Remote()
    yield r
    r.close()


KEYS = st.sampled_from(["k0", "k1", "k2", "kv/3", "weights.shard-4"])
VALUES = st.binary(min_size=1, max_size=300)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, VALUES),
        st.tuples(st.just("get"), KEYS, st.just(b"")),
        st.tuples(st.just("delete"), KEYS, st.just(b"")),
        st.tuples(st.just("exists"), KEYS, st.just(b"")),
    ),
    max_size=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_ems_behaves_like_a_dict(remote: Remote, ops: list[tuple[str, str, bytes]]) -> None:
    model: dict[str, bytes] = {}

    async def check() -> None:
        ems = remote.ems
        await ems.BatchDelete(
            ems_pb2.BatchDeleteRequest(keys=["k0", "k1", "k2", "kv/3", "weights.shard-4"])
        )
        for op, key, value in ops:
            if op == "put":
                await ems.Put(ems_pb2.PutRequest(key=key, data=value))
                model[key] = value
            elif op == "get":
                try:
                    got = (await ems.Get(ems_pb2.GetRequest(key=key))).data
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() is grpc.StatusCode.NOT_FOUND and key not in model
                else:
                    assert got == model[key]
            elif op == "delete":
                deleted = (await ems.Delete(ems_pb2.DeleteRequest(key=key))).deleted
                assert deleted == (key in model)
                model.pop(key, None)
            else:
                assert (await ems.Exists(ems_pb2.ExistsRequest(key=key))).exists == (key in model)
        stat = await ems.Stat(ems_pb2.StatRequest())
        assert stat.objects == len(model)
        assert stat.dram_bytes == sum(len(v) for v in model.values())

    remote.run(check())
