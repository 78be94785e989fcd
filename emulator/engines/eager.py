"""`asyncio.gather` for calls that mostly answer at their first step: EMS writes a put's copies at
once (engines/ems/writes.py), and a pool of this process answers them without suspending. A
gather made a task per copy, a future over them and a done callback each (about a tenth of a
put's CPU) for work that never waited. `gather_eager` takes each call's first step in the
caller's own task, in order, and spends a task only from the first call that waits: that one
is awaited where it stands (its first step handed on as `DeadlineWheel.run` does, so a bound it
entered still names this task), the ones after it start as tasks at once, as gather starts them.

What gather promised stays: every call is started (a copy that fails does not spare the others
their attempt, nor a pool its suspicion), the results come in the calls' order, the first failure
is raised while the calls still running go on (their own failures retrieved, not logged as
unretrieved), and a cancellation of the caller cancels the calls still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from cmemu.emulator.engines.wheel import resumed

T = TypeVar("T")


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _go_on(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Calls left running after a failure was raised: their outcome is nobody's to read."""
    for task in tasks:
        task.add_done_callback(_retrieve)


_Waiter = tuple[int, Coroutine[Any, Any, Any], Any]


def _start(
    calls: Sequence[Coroutine[Any, Any, Any]], results: list[Any]
) -> tuple[_Waiter | None, list[tuple[int, asyncio.Future[Any]]]]:
    """Each call's first step here, in order, until one waits (that one and its first step's
    future) or fails (raised once the rest are started); the calls after it start as tasks."""
    failure: Exception | None = None
    waiter: _Waiter | None = None
    tasks: list[tuple[int, asyncio.Future[Any]]] = []
    for i, call in enumerate(calls):
        if waiter is not None or failure is not None:
            tasks.append((i, asyncio.ensure_future(call)))
            continue
        try:
            waiting = call.send(None)
        except StopIteration as answered:
            results[i] = answered.value
        except Exception as exc:
            failure = exc
        except BaseException:
            for rest in calls[i + 1 :]:
                rest.close()
            raise
        else:
            waiter = (i, call, waiting)
    if failure is not None:
        _go_on([task for _, task in tasks])
        raise failure
    return waiter, tasks


async def gather_eager(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    results: list[Any] = [None] * len(calls)
    waiter, tasks = _start(calls, results)
    running = [task for _, task in tasks]
    try:
        if waiter is not None:
            i, call, waiting = waiter
            results[i] = await resumed(call, waiting)
        for n, (i, task) in enumerate(tasks):
            results[i] = await task
            running = [t for _, t in tasks[n + 1 :]]
    except asyncio.CancelledError:
        for task in running:
            task.cancel()
        raise
    except Exception:
        _go_on(running)
        raise
    return results
