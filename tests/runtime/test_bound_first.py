"""Bound first, served after (issue 18): the web view and the OpenAI endpoint bind their sockets
before `cmemu up` writes its state file and serve them once its starts end (runtime/heap.py
`after_starts`), so that aiohttp's import is not the boot's. A client that connects in between
waits in the socket's backlog and is answered once the server serves."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import aiohttp

from cmemu.emulator.runtime import heap
from cmemu.emulator.runtime.webview import WebView
from cmemu.emulator.testing import running_supernode
from cmemu.v1 import fabric_pb2


async def test_what_waits_for_the_starts_runs_when_the_last_one_ends() -> None:
    """Nested starts on one loop (`cmemu up`'s, around its supernode's): the callback waits for
    the outer one; with no start in progress it runs at once."""
    ran: list[str] = []
    try:
        with heap.starting():
            with heap.starting():
                heap.after_starts(lambda: ran.append("served"))
            assert ran == []  # the state file is not written yet
        assert ran == ["served"]
        heap.after_starts(lambda: ran.append("at once"))
        assert ran == ["served", "at once"]
    finally:
        heap.stopped()  # what the starts froze is collectable again


async def test_what_waited_and_failed_fails_alone() -> None:
    """A call that raises is logged: the start it waited for has ended well (the state file is
    written), and the calls after it still run. Its twin: the raising call did run."""
    ran: list[str] = []

    def fails() -> None:
        ran.append("failed")
        raise RuntimeError("a bad certificate, say")

    try:
        with heap.starting():
            heap.after_starts(fails)
            heap.after_starts(lambda: ran.append("served"))
        assert ran == ["failed", "served"]
    finally:
        heap.stopped()


async def test_a_start_on_another_loop_does_not_hold_this_one() -> None:
    """Starts are counted per event loop: an instance hosted in another thread (the tests'
    hosted_instance) does not delay this loop's endpoints."""
    ran: list[str] = []
    entered, leave = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()

    def other() -> None:
        async def start() -> None:
            with heap.starting():
                loop.call_soon_threadsafe(entered.set)
                await asyncio.to_thread(leave.wait)

        asyncio.run(start())

    thread = asyncio.create_task(asyncio.to_thread(other))
    try:
        await entered.wait()
        heap.after_starts(lambda: ran.append("here"))
        assert ran == ["here"]
    finally:
        leave.set()
        await thread
        heap.stopped()


async def test_a_page_that_connects_before_the_view_serves_is_answered() -> None:
    """Its twin: bound but not served, the request waits (a socket not bound would refuse it,
    and the task would be done with the error)."""
    async with running_supernode("cm-mini") as sn:
        view = WebView(sn.clients)
        await view.bind()
        try:
            async with aiohttp.ClientSession() as session:
                asking = asyncio.create_task(session.get(view.url + "api/snapshot"))
                await asyncio.sleep(0.3)
                assert not asking.done()  # connected: queued in the backlog, nobody answers
                await view.serve()
                async with asyncio.timeout(30):
                    response = await asking
                assert response.status == 200
                assert (await response.json())["devices"]
                response.release()
        finally:
            await view.__aexit__(None, None, None)


async def test_the_fabric_makes_its_link_graph_once_the_starts_end() -> None:
    """cm384's link graph is 50-100 ms of a boot: made once the launch is ready (here: once
    the start this test holds open, as `cmemu up` does until its state file, ends). Its twin:
    asked before, the fabric makes it then and answers (a fault injected, listed)."""
    launching = contextlib.ExitStack()
    launching.enter_context(heap.starting())
    try:
        async with running_supernode("cm-mini") as sn:
            fabric = sn.local.fabric
            assert fabric is not None
            assert not fabric.built  # every server SERVING, no graph yet
            launching.close()
            assert fabric.built
        launching = contextlib.ExitStack()
        launching.enter_context(heap.starting())
        async with running_supernode("cm-mini") as sn:
            fabric = sn.local.fabric
            assert fabric is not None and not fabric.built
            link = sn.topology.links[0]
            added = await sn.clients.fabric().InjectFault(
                fabric_pb2.FabricFault(kind="link-down", target=f"{link.a}~{link.b}")
            )
            assert fabric.built
            listed = await sn.clients.fabric().ListFaults(fabric_pb2.ListFaultsRequest())
            assert [f.id for f in listed.faults] == [added.id]
    finally:
        launching.close()
        heap.stopped()
