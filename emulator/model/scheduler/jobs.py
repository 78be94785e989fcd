"""A job's request for NPUs and what it was given, as plain records."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cmemu.emulator.model.errors import InvalidArgumentError, quote

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A job name: a log field and a CLI argument, so no spaces or slashes; 128 characters at most."""


def check_job(job: str, field: str = "job") -> str:
    if not JOB_NAME.fullmatch(job):
        raise InvalidArgumentError(
            f"job name {quote(job)} is not valid: 1-128 of letters, digits, '.', '_', '-', "
            "starting with a letter or digit",
            field=field,
            subject=job or None,
            reason="MALFORMED_JOB",
        )
    return job


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """What a job asks for. `policy` empty: the scheduler's default policy."""

    job: str
    npus: int
    whole_nodes: bool = False  # only nodes that are entirely free, taken entirely
    same_rack: bool = False  # every NPU in one rack
    priority: int = 0  # higher first in a pending queue; recorded with the allocation
    policy: str = ""


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """The NPUs a job holds, in id order. `failed` are those of them reported failed since."""

    request: JobRequest
    policy: str  # the policy that placed it (the request's, or the default)
    npus: tuple[str, ...]
    allocated_ns: int
    failed: frozenset[str] = frozenset()

    @property
    def job(self) -> str:
        return self.request.job


@dataclass(frozen=True, kw_only=True)
class Replacement:
    """A failed NPU of a job and the spare that took its place."""

    old: str
    new: str
