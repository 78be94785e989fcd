"""The SSD tier below EMS's DRAM: one file per object and one for its metadata, in a directory
that outlives the EMS process, so a restarted EMS finds what it had moved there.

Synchronous file I/O: the service calls it through asyncio.to_thread, never on the event loop.
The ssd-loss fault `lose()`s the drives (their files deleted) until they are `replace()`d.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cmemu.emulator.model.ems import ObjectMeta, Tier, decode_label, encode_label


class SsdTier:
    def __init__(self, directory: Path, capacity: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self.used = 0
        self.lost = False  # ssd-loss: the drives are gone until replaced (nothing fits)

    def _path(self, key: str) -> Path:
        return self.directory / hashlib.sha256(key.encode()).hexdigest()

    def fits(self, size: int) -> bool:
        return not self.lost and self.used + size <= self.capacity

    def lose(self) -> None:
        """The drives fail: every file on them is gone, and nothing is written until
        `replace()` puts in new, empty ones."""
        self.lost = True
        if self.directory.exists():
            for path in self.directory.iterdir():
                if path.suffix in (".bin", ".json", ".tmp"):
                    path.unlink(missing_ok=True)
        self.used = 0

    def replace(self) -> None:
        self.lost = False

    def write(self, meta: ObjectMeta, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(meta.key)
        path.with_suffix(".bin").write_bytes(data)
        tmp = path.with_suffix(".tmp")
        head: dict[str, object] = {"label": encode_label(meta)}
        if meta.chunked:
            head |= {"chunk_bytes": meta.chunk_bytes, "crcs": list(meta.crcs or ())}
        tmp.write_text(json.dumps(head))
        tmp.replace(path.with_suffix(".json"))  # the object is on SSD once this lands
        self.used += meta.size

    def read(self, key: str) -> bytes:
        return self._path(key).with_suffix(".bin").read_bytes()

    def remove(self, meta: ObjectMeta) -> None:
        path = self._path(meta.key)
        path.with_suffix(".json").unlink(missing_ok=True)
        path.with_suffix(".bin").unlink(missing_ok=True)
        self.used -= meta.size

    def load(self) -> list[ObjectMeta]:
        """Every object the directory holds, as SSD-tier metadata (a full scan: recounts use)."""
        found = []
        self.used = 0
        for head in sorted(self.directory.glob("*.json")):
            doc = json.loads(head.read_text())
            meta = decode_label(doc["label"])
            if meta is not None:
                if meta.chunked:
                    meta.chunk_bytes = doc.get("chunk_bytes", 0)
                    meta.crcs = tuple(doc.get("crcs", ()))
                meta.tier = Tier.SSD
                found.append(meta)
                self.used += meta.size
        return found
