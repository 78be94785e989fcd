"""Two test processes on one machine never get the same block of ports before either binds it
(`cmemu.emulator.testing._claim`): the cause of port clashes between concurrent pytest sessions."""

from __future__ import annotations

import subprocess
import sys

from cmemu.emulator.testing import _claim, free_port_block

SEARCH = (32100, 32400)  # above the suite's own range (22000-32000), below the ephemeral ports
COUNT = 8  # plus the two EXTRAS ports

HOLDER = f"""
import sys
from cmemu.emulator.testing import _claim, free_port_block
print(free_port_block({COUNT}, search={SEARCH}), flush=True)
sys.stdin.readline()  # holds its claim while alive
"""


def _overlap(a: int, b: int, width: int) -> bool:
    return a < b + width and b < a + width


def test_a_block_another_live_process_claimed_is_not_handed_out_again() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        theirs = int(holder.stdout.readline())
        mine = free_port_block(COUNT, search=SEARCH)  # nothing is bound: only the claim stops it
        assert not _overlap(mine, theirs, COUNT + 2), (mine, theirs)
    finally:
        holder.communicate("\n", timeout=30)
    # the twin: the holder has exited, so its claim no longer keeps the block from anyone
    assert _claim(theirs, COUNT + 2) is None


def test_a_process_gets_its_own_claimed_block_again() -> None:
    first = free_port_block(COUNT, search=SEARCH)
    assert free_port_block(COUNT, search=SEARCH) == first
