"""The final verification, once every fault is cleared and EMS has settled: every acknowledged UB
byte, counter, SEND and EMS object read back against the ledger (each read retried a few times:
a failure now is a loss, not a fault), the store listed for keys that should be gone, and the
history of every key some read disagreed about, for a reproduction."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

import grpc
import numpy as np

from bench.soak.calls import pages
from bench.soak.config import CALL_TIMEOUT_S, KEY_PREFIX
from bench.soak.context import Soak
from bench.soak.ems import EmsLoad
from bench.soak.ledger import describe, holds, said, streamed
from bench.soak.messages import MessageLoad
from bench.soak.ub import UbLoad
from cmemu.emulator.client import health
from cmemu.v1 import ems_pb2, ub_pb2


class Verify:
    """Reads everything back; each check returns its figures for the report. The readers are
    drawn from the run's RNG, in the order of the checks."""

    def __init__(self, soak: Soak, ub: UbLoad, messages: MessageLoad, ems: EmsLoad) -> None:
        self.soak = soak
        self.calls = soak.calls
        self.ub = ub
        self.messages = messages
        self.ems = ems

    async def settle_ems(self, timeout_s: float) -> ems_pb2.StatResponse:
        """Wait until every pool is healthy again and nothing is under-replicated."""
        deadline = time.monotonic() + timeout_s
        while True:
            stat = await self.soak.ems.Stat(ems_pb2.StatRequest())
            settled = all(p.healthy for p in stat.pools) and not stat.under_replicated
            if settled or time.monotonic() > deadline:
                return stat
            await asyncio.sleep(0.5)

    async def _read(
        self, reader: str, eid: int, offset: int, size: int, detail: str
    ) -> ub_pb2.UbCompletion | grpc.StatusCode:
        tx = ub_pb2.UbTransaction(
            op=ub_pb2.UB_OP_READ, dst=ub_pb2.UbAddress(eid=eid, offset=offset), size=size
        )
        return await self.calls.retry(
            "verify.ub_read", lambda: self.soak.submit(reader, tx), detail
        )

    async def regions(self) -> dict[str, int]:
        lost = unknown = unreadable = 0
        for region in self.ub.regions:
            reader = self.soak.rng.choice(self.soak.all_devices).id
            got = await self._read(
                reader, region.eid, region.offset, region.size, f"{reader} <- {region.device}"
            )
            unknown += int(np.count_nonzero(~region.known))
            if isinstance(got, grpc.StatusCode):
                unreadable += 1
                lost += int(np.count_nonzero(region.known))
                self.calls.wrong(f"final UB read of {region.device} by {reader}: {got.name}")
                continue
            bad = region.differing(0, got.data, region.size)
            if bad:
                differ = np.frombuffer(got.data, np.uint8) != region.shadow
                first = int(np.flatnonzero(differ & region.known)[0])
                self.calls.wrong(
                    f"final UB read of {region.device} (EID {region.eid}) region offset "
                    f"{region.offset}: {bad} acknowledged bytes differ, first at +{first}"
                )
            lost += bad
        lost_words = 0
        for word in self.ub.words:
            read = await self._read(
                word.device, word.eid, word.offset, 8, f"counter {word.device} +{word.offset}"
            )
            value = (
                None if isinstance(read, grpc.StatusCode) else int.from_bytes(read.data, "little")
            )
            if value is None or (word.possible is not None and value not in word.possible):
                lost_words += 1
                self.calls.wrong(
                    f"final counter {word.device} +{word.offset}: {value}, "
                    f"expected one of {word.possible}"
                )
        return {
            "lost_bytes": lost,
            "unknown_bytes": unknown,
            "unreadable_regions": unreadable,
            "lost_counters": lost_words,
        }

    async def _fetch(self, key: str, reader: str, stream: bool) -> bytes:
        if stream:
            return (await self.ems.get_stream(key, reader))[0]
        request = ems_pb2.GetRequest(key=key, device=reader)
        return (await self.soak.ems.Get(request, timeout=CALL_TIMEOUT_S)).data

    async def _exists(self, key: str) -> bool:
        request = ems_pb2.ExistsRequest(key=key)
        return (await self.soak.ems.Exists(request, timeout=CALL_TIMEOUT_S)).exists

    async def objects(self) -> dict[str, int]:
        objects, disagree = self.ems.objects, self.ems.disagree
        lost = resurrected = checked = unreadable = 0
        for key, possible in sorted(objects.states.items()):
            if possible is None:
                continue
            checked += 1
            if possible == [None]:  # deleted: Exists must say no (whatever its size would be)
                there = await self.calls.retry("verify.ems_exists", partial(self._exists, key), key)
                if there is False:
                    continue
                if there is True:
                    resurrected += 1
                    disagree(f"final: deleted key {key} exists again", key)
                else:
                    unreadable += 1
                    disagree(f"final: Exists({key}) failed: {there}", key)
                continue
            big = streamed(possible)
            reader = self.soak.rng.choice(self.soak.npus).id
            got = await self.calls.retry(
                "verify.ems_get", partial(self._fetch, key, reader, big), key
            )
            if isinstance(got, grpc.StatusCode) and got is not grpc.StatusCode.NOT_FOUND:
                unreadable += 1
                lost += 1
                disagree(f"final: {key} unreadable: {got.name}; ledger {describe(possible)}", key)
                continue
            value = None if isinstance(got, grpc.StatusCode) else got
            if holds(possible, value):
                continue
            lost += 1
            disagree(f"final: {key}: {said(value)}; ledger {describe(possible)}", key)
        # and nothing under the prefix that the ledger says is gone or never was
        listed: set[str] = set()
        async for page in pages(
            lambda token: self.soak.ems.List(
                ems_pb2.ListRequest(prefix=KEY_PREFIX, page_size=1000, page_token=token)
            )
        ):
            listed |= {o.key for o in page.objects}
        listed_gone = 0
        for key in sorted(listed):
            if objects.states.get(key, [None]) == [None]:
                listed_gone += 1
                disagree(f"final: List shows {key}, deleted or never put", key)
        return {
            "lost_objects": lost,
            "unreadable_objects": unreadable,
            "resurrected_objects": resurrected,
            "listed_deleted_keys": listed_gone,
            "objects_checked": checked,
            "unknown_objects": sum(p is None for p in objects.states.values()),
        }

    async def messages_received(self) -> dict[str, int]:
        sends = self.messages.sends
        for device in sorted(sends.mailboxes):
            while await self.messages.receive(device):
                pass
        for ident in sorted(sends.acked)[:20]:
            self.calls.wrong(
                f"final: SEND {ident} to {sends.expected[ident][0]} acknowledged, never received"
            )
        return {
            "lost_messages": len(sends.acked),
            "messages_maybe_lost": len(sends.expected) - len(sends.acked),  # failed sends
        }

    async def bad_key_report(self) -> dict[str, Any]:
        """For each key a read disagreed about: its history, and what List says of it now."""
        objects = self.ems.objects
        out: dict[str, Any] = {}
        for key in sorted(objects.bad)[:50]:
            listed = await self.soak.ems.List(ems_pb2.ListRequest(prefix=key, page_size=1))
            info = [
                {"tier": ems_pb2.Tier.Name(o.tier), "size": o.size, "replicas": list(o.replicas)}
                for o in listed.objects
                if o.key == key
            ]
            out[key] = {
                "ledger": describe(objects.states.get(key, [None])),
                "listed_now": info,
                "history": list(objects.history.get(key, ())),
            }
        return out

    async def not_serving(self) -> int:
        """Devices not SERVING at the end, asked a few dozen at a time, each retried as the other
        verification reads are: 624 checks at once on a loaded host time out without saying
        anything about the devices (a failure after the retries counts as not serving)."""
        soak = self.soak
        limit = asyncio.Semaphore(32)

        async def status(device_id: str) -> str | grpc.StatusCode:
            channel = soak.clients.channel(device_id)
            async with limit:
                return await self.calls.retry(
                    "verify.health", partial(health.check, channel, timeout_s=10.0), device_id
                )

        statuses = await asyncio.gather(*(status(d.id) for d in soak.all_devices))
        return sum(s != "SERVING" for s in statuses)
