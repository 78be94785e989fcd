"""The chaos runner's count of lost objects (`expect.lost_objects`) against a live in-process
cm-mini: an EMS that refuses for a moment (killed, then back) loses nothing, since a refusal
that says to try again is asked again; the twin, an EMS that stays down, counts every object,
as an object nobody can read is lost to its users; and an object the store no longer has
counts at once."""

from __future__ import annotations

import asyncio

from cmemu.emulator.client import faults
from cmemu.emulator.client.ems import EmsClient
from cmemu.emulator.runtime.chaos import files
from cmemu.emulator.runtime.chaos.workloads import LOST_RETRY_S, Workloads
from cmemu.emulator.testing import running_supernode

SCENARIO = """\
version: 1
name: lost
workloads:
  ems: {objects: 4, size: 1KiB, prefix: test/lost/}
steps:
  - {id: kill, at: 5s, fault: service-kill, target: {service: ems}}
expect:
  lost_objects: 0
"""


async def test_a_store_back_in_a_moment_loses_nothing_one_gone_for_good_loses_all() -> None:
    async with running_supernode("cm-mini", time_scale=50) as sn:
        workloads = Workloads(clients=sn.clients, scenario=files.parse_text(SCENARIO))
        await workloads.start()  # the four objects, put
        assert await workloads.lost_objects() == 0

        killed = await faults.inject(sn.clients, "service-kill", "ems")
        # asked again for as long as a hung test may take: back before that, whatever the load
        counting = asyncio.ensure_future(workloads.lost_objects(wait_s=600))
        await asyncio.sleep(2 * LOST_RETRY_S)  # refused meanwhile (at least once, mostly)
        await faults.clear(sn.clients, killed.id)
        assert await counting == 0

        await EmsClient(sn.clients).delete_many(["test/lost/1"])  # the store answers again
        assert await workloads.lost_objects() == 1  # gone: counted at once

        killed = await faults.inject(sn.clients, "service-kill", "ems")
        assert await workloads.lost_objects(wait_s=1) == 4  # not back in time: none read
        await faults.clear(sn.clients, killed.id)
