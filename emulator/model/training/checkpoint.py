"""Checkpoints: when one is due, how big it is, how it is cut into EMS objects, what a failure
loses.

A checkpoint is the job's training state (weights, master weights and optimizer moments:
`checkpoint_bytes_per_param` per weight), at most what the job's dies can hold in their HBM:
a job on few NPUs trains only what fits there. Each NPU writes its shard as size-only CHECKPOINT
objects of at most `checkpoint_object_max_bytes` into EMS, which keeps them in its pools and
spills them to its SSD tier. A manifest of real bytes (its CRC-32 kept by EMS) lists them, so
a restore finds a corrupt checkpoint and falls back to the one before (`checkpoints_kept`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from cmemu.emulator.model.hardware import DEFAULT_PROFILE, HardwareProfile
from cmemu.emulator.model.training.spec import TrainingShape
from cmemu.emulator.model.training.step import total_params


def due(step: int, every: int) -> bool:
    """A checkpoint follows every `every`-th completed step."""
    return every > 0 and step > 0 and step % every == 0


def steps_lost(step: int, last_checkpoint_step: int) -> int:
    """Steps done since the last checkpoint: redone after a restart."""
    return max(0, step - last_checkpoint_step)


def checkpoint_bytes(shape: TrainingShape, profile: HardwareProfile = DEFAULT_PROFILE) -> int:
    state = total_params(shape.model) * profile.training.checkpoint_bytes_per_param
    return math.ceil(min(state, shape.dies * profile.npu.hbm_bytes_per_die))


@dataclass(frozen=True, kw_only=True)
class Shard:
    key: str
    npu_index: int  # which of the job's NPUs writes and reads it
    size: int


def shards(
    job: str, step: int, shape: TrainingShape, profile: HardwareProfile = DEFAULT_PROFILE
) -> list[Shard]:
    """The EMS objects of the checkpoint after `step`: each NPU's share, in objects of at most
    checkpoint_object_max_bytes."""
    per_npu = math.ceil(checkpoint_bytes(shape, profile) / shape.npus)
    pieces = math.ceil(per_npu / profile.training.checkpoint_object_max_bytes)
    size = math.ceil(per_npu / pieces)
    return [
        Shard(key=f"{prefix(job)}{step:012d}/{n:04d}-{k:03d}", npu_index=n, size=size)
        for n in range(shape.npus)
        for k in range(pieces)
    ]


def prefix(job: str) -> str:
    return f"checkpoint/{job}/"


def manifest_key(job: str, step: int) -> str:
    """The checkpoint's manifest: real bytes (so EMS keeps their CRC-32), written last, read
    first on a restore; a checkpoint whose manifest does not verify is not restored."""
    return f"{prefix(job)}{step:012d}/manifest"


def manifest(job: str, step: int, keys: list[str]) -> bytes:
    return json.dumps({"job": job, "step": step, "shards": keys}, sort_keys=True).encode()


def manifest_keys(data: bytes, job: str, step: int) -> list[str]:
    """The shard keys a manifest lists; ValueError for one of another checkpoint."""
    doc = json.loads(data)
    if not isinstance(doc, dict) or not isinstance(doc.get("shards"), list):
        raise ValueError("no manifest")
    if doc.get("job") != job or doc.get("step") != step:
        raise ValueError(f"the manifest is of {doc.get('job')!r} step {doc.get('step')!r}")
    return [str(k) for k in doc["shards"]]
