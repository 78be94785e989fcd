"""The SSD tier's files (emulator/engines/ems/ssd.py): what a restarted EMS loads back, and the
drives lost (ssd-loss) and replaced."""

from __future__ import annotations

import zlib
from pathlib import Path

from cmemu.emulator.engines.ems.ssd import SsdTier
from cmemu.emulator.model.ems import ObjectMeta, Tier


def _meta(key: str, data: bytes) -> ObjectMeta:
    return ObjectMeta(key=key, kind=0, size=len(data), crc=zlib.crc32(data), pinned=False, gen=3)


def test_a_restart_loads_every_object_the_directory_holds(tmp_path: Path) -> None:
    ssd = SsdTier(tmp_path, capacity=1024)
    for key in ("x", "y"):
        ssd.write(_meta(key, key.encode() * 10), key.encode() * 10)
    again = SsdTier(tmp_path, capacity=1024)
    loaded = sorted(again.load(), key=lambda m: m.key)
    assert [(m.key, m.size, m.tier, m.gen) for m in loaded] == [
        ("x", 10, Tier.SSD, 3), ("y", 10, Tier.SSD, 3)]  # fmt: skip
    assert again.used == 20 and again.read("y") == b"y" * 10


def test_lost_drives_hold_nothing_and_take_nothing_until_replaced(tmp_path: Path) -> None:
    ssd = SsdTier(tmp_path, capacity=1024)
    ssd.write(_meta("x", b"x" * 10), b"x" * 10)
    assert ssd.fits(100)
    ssd.lose()
    assert (ssd.used, ssd.load(), list(tmp_path.iterdir())) == (0, [], [])
    assert not ssd.fits(1)
    ssd.replace()
    assert ssd.fits(1024) and not ssd.fits(1025)
