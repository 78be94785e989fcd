"""Health checks from the client side: one device (`cmemu probe`) or many at once (`cmemu ls`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cmemu.emulator.client import h2async
from cmemu.emulator.client.credentials import ANONYMOUS, Credentials
from cmemu.emulator.client.status import code_name, reply_of
from cmemu.emulator.model.errors import DeadlineExceededError, EmulatorError, UnavailableError

UNREACHABLE = "UNREACHABLE"


def status_name(status: int) -> str:
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))


async def check(
    channel: grpc.aio.Channel,
    service: str = "",
    timeout_s: float = 2.0,
    *,
    wait_for_ready: bool = False,
) -> str:
    """The health status name of `service`; raises the EmulatorError its status names when the
    call fails (UnavailableError for a server that does not answer). `wait_for_ready`: a
    server not listening yet is waited for (within `timeout_s`), not failed at once."""
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service=service)
    call = stub.Check(request, timeout=timeout_s, wait_for_ready=wait_for_ready)
    response = await reply_of(None, call)
    return status_name(response.status)


async def serving(channel: grpc.aio.Channel, timeout_s: float) -> bool:
    """The whole server answers SERVING within `timeout_s`; False for any other answer or a
    failed call (stopped, hung, cut off): the question is only whether it serves."""
    try:
        return await check(channel, "", timeout_s) == "SERVING"
    except EmulatorError:
        return False


DOWN_CODES: dict[type[EmulatorError], str] = {
    UnavailableError: UNREACHABLE,  # nothing answers: crashed, stopped, cut off
    DeadlineExceededError: "DEADLINE_EXCEEDED",  # accepted, never answered: hung
}
"""What a failed check says of the device's health; any other failure is the caller's (an
unknown service name: NOT_FOUND) and raises."""


async def status(channel: grpc.aio.Channel, service: str = "", timeout_s: float = 2.0) -> str:
    """The health of `service` as a name, never raising for the device's own state: a crashed
    or unreachable device is UNREACHABLE, a hung one DEADLINE_EXCEEDED (a health check is
    asked to learn that, as `cmemu ls` shows it); raises for another failure."""
    try:
        return await check(channel, service, timeout_s)
    except EmulatorError as exc:
        down = DOWN_CODES.get(type(exc))
        if down is None:
            raise
        return down


async def check_address(
    address: str,
    service: str = "",
    timeout_s: float = 2.0,
    credentials: Credentials = ANONYMOUS,
) -> str:
    """Over TLS when `credentials` has a CA (health itself needs no token)."""
    async with Credentials(ca_pem=credentials.ca_pem).channel(address) as channel:
        return await check(channel, service, timeout_s)


async def check_many(
    addresses: Iterable[str],
    *,
    timeout_s: float = 2.0,
    concurrency: int = 64,
    credentials: Credentials = ANONYMOUS,
) -> dict[str, str]:
    """Status name per address; UNREACHABLE (or the gRPC code name) where the call failed."""
    limit = asyncio.Semaphore(concurrency)

    async def one(address: str) -> tuple[str, str]:
        async with limit:
            try:
                return address, await check_address(
                    address, timeout_s=timeout_s, credentials=credentials
                )
            except EmulatorError as exc:
                name = code_name(exc)
                return address, UNREACHABLE if name == "UNAVAILABLE" else name

    return dict(await asyncio.gather(*(one(a) for a in addresses)))


NO_ANSWER = "NO_ANSWER"
"""A survey's word for a check that was not answered within the surveyor's deadline, twice: a
hung device, or a host too busy to answer in time; never the device's own health status."""


async def survey(
    addresses: Iterable[str],
    *,
    timeout_s: float = 2.0,
    concurrency: int = 32,
    credentials: Credentials = ANONYMOUS,
) -> dict[str, str]:
    """check_many for a report of many devices (`cmemu status`): at most `concurrency` checks
    at a time, so that hundreds of devices do not slow their own host into missing the
    deadline; a check that timed out is asked once more, alone-ish (a quarter of the
    concurrency) with twice the time, and is NO_ANSWER only when that one times out too."""
    first = await check_many(
        addresses, timeout_s=timeout_s, concurrency=concurrency, credentials=credentials
    )
    late = [a for a, s in first.items() if s == "DEADLINE_EXCEEDED"]
    if late:
        again = await check_many(
            late,
            timeout_s=2 * timeout_s,
            concurrency=max(1, concurrency // 4),
            credentials=credentials,
        )
        first |= {a: NO_ANSWER if s == "DEADLINE_EXCEEDED" else s for a, s in again.items()}
    return first


async def wait_serving(
    addresses: Iterable[str],
    *,
    timeout_s: float,
    still_starting: Callable[[], None] = lambda: None,
    credentials: Credentials = ANONYMOUS,
    call_timeout_s: float = 5.0,
    concurrency: int | None = None,
) -> None:
    """Return once every address answers SERVING; raise UnavailableError naming the laggards
    after timeout_s. `still_starting` may raise to give up early (a process died). At most
    `concurrency` checks are open at a time (None: each way of asking its own default).

    Plaintext servers are asked on bare asyncio sockets (h2async: the same Health/Check on the
    wire, without a grpc.aio channel per server, which is most of the cost of asking 629);
    TLS servers through grpc.aio with the CA of `credentials`."""
    pending = list(addresses)
    statuses: dict[str, str] = {}
    limit = {} if concurrency is None else {"concurrency": concurrency}
    deadline = time.monotonic() + timeout_s
    while pending:
        still_starting()
        if time.monotonic() >= deadline:
            shown = ", ".join(f"{a} {statuses.get(a, UNREACHABLE)}" for a in pending[:5])
            more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
            raise UnavailableError(f"{len(pending)} servers not SERVING: {shown}{more}")
        if credentials.ca_pem is None:
            statuses = await h2async.status_many(pending, timeout_s=call_timeout_s, **limit)
        else:
            statuses = await check_many(
                pending, timeout_s=call_timeout_s, credentials=credentials, **limit
            )
        pending = [a for a, s in statuses.items() if s != "SERVING"]
        if pending:
            await asyncio.sleep(0.1)
