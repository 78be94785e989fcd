"""Tenants of the Tokens service (issue 24 item 3): API keys, priority classes, rate limits,
quotas and metering, as pure data and arithmetic on an injected clock (emulated seconds).

The keys file grows from the token file. A file holding one token (the format of
`--token-file` so far) is one tenant, `default`, whose key is also the emulator's token. A keys
file is TOML:

    version = 1
    admin = "..."              # the emulator's token: gRPC state changes, cmemu's own commands;
                               # on the HTTP endpoint it is the key of tenant `default`
    [tenants.acme]
    key = "..."                # its API key (the OpenAI client's api_key)
    priority = "online"        # online | near-line | offline
    requests_per_min = 600     # emulated minutes; absent: unlimited
    tokens_per_min = 2000000   # prompt + completion tokens
    quota_tokens = 100000000   # prompt + completion tokens over the instance's life

Priority classes order admission: online first, near-line next, offline fills what is idle and
is preempted first (services/serving/admission.py does it). Rate limits are token buckets that
refill continuously and hold a minute's worth; a request that would overdraw one is refused with
how long until it would fit (HTTP 429 and Retry-After). A quota is a hard total (429,
`insufficient_quota`, no Retry-After).
"""

from __future__ import annotations

import enum
import hmac
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cmemu.emulator.model.errors import EmulatorError, InvalidArgumentError, quote

KEYS_VERSION = 1
DEFAULT_TENANT = "default"
NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
KEY_CHARS_MIN = 16
KEY = re.compile(r"^[!#-\[\]-~]+$")  # printable ASCII but space, '"' and backslash


class Priority(enum.StrEnum):
    ONLINE = "online"
    NEAR_LINE = "near-line"
    OFFLINE = "offline"

    @property
    def rank(self) -> int:
        """0 is served first."""
        return list(Priority).index(self)


@dataclass(frozen=True, kw_only=True)
class Tenant:
    """A tenant of the HTTP endpoint: its key, priority class and rate limits."""

    name: str
    key: str = field(repr=False)
    priority: Priority = Priority.ONLINE
    requests_per_min: float | None = None
    tokens_per_min: float | None = None
    quota_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class Keys:
    """The emulator's token (`admin`) and its tenants (the admin key's own tenant first)."""

    admin: str = field(repr=False)
    tenants: tuple[Tenant, ...]

    def tenant(self, key: str) -> Tenant | None:
        """The tenant whose key this is (compared in constant time, every key tried)."""
        found = None
        for tenant in self.tenants:
            if hmac.compare_digest(key.encode(), tenant.key.encode()):
                found = tenant
        return found

    def names(self) -> list[str]:
        return [t.name for t in self.tenants]


def single(token: str) -> Keys:
    """One token: one unlimited online tenant, `default`."""
    return Keys(admin=token, tenants=(Tenant(name=DEFAULT_TENANT, key=token),))


def parse_keys(text: str, where: str) -> Keys:
    """A keys file or a token file (InvalidArgumentError naming `where` and the field)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raw = None
    if not isinstance(raw, dict) or "version" not in raw:
        token = text.strip()
        if not token or any(c.isspace() for c in token):
            raise InvalidArgumentError(
                f"{where}: one token is wanted, without spaces (or a keys file: version = 1)"
            )
        return single(token)
    return _keys(raw, where)


def _keys(raw: Mapping[str, Any], where: str) -> Keys:
    if raw.get("version") != KEYS_VERSION:
        raise InvalidArgumentError(
            f"{where}: keys file version {quote(raw.get('version'))} unsupported; expected "
            f"{KEYS_VERSION}",
            field="version",
        )
    unknown = sorted(set(raw) - {"version", "admin", "tenants"})
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown fields {unknown}", field=unknown[0])
    admin = _key(raw.get("admin"), f"{where}: admin")
    tables = raw.get("tenants", {})
    if not isinstance(tables, Mapping):
        raise InvalidArgumentError(f"{where}: tenants must be a table", field="tenants")
    tenants = [Tenant(name=DEFAULT_TENANT, key=admin)]
    for name, body in tables.items():
        tenants.append(_tenant(name, body, f"{where}: tenants.{name}"))
    seen: dict[str, str] = {}
    for t in tenants:
        if t.key in seen:
            raise InvalidArgumentError(
                f"{where}: tenants {seen[t.key]} and {t.name} share a key", field="key"
            )
        seen[t.key] = t.name
    return Keys(admin=admin, tenants=tuple(tenants))


def _key(value: Any, where: str) -> str:
    if not (isinstance(value, str) and len(value) >= KEY_CHARS_MIN and KEY.match(value)):
        raise InvalidArgumentError(
            f"{where} must be a key of at least {KEY_CHARS_MIN} printable ASCII characters, "
            "without spaces, quotes or backslashes",
            field="key",
        )
    return value


def _tenant(name: str, body: Any, where: str) -> Tenant:
    if name == DEFAULT_TENANT or not NAME.match(name):
        raise InvalidArgumentError(
            f"{where}: a tenant name is 1-63 lower-case letters, digits, '.', '_' or '-' (and "
            f"not {DEFAULT_TENANT!r}, the admin key's)",
            field="tenants",
        )
    if not isinstance(body, Mapping):
        raise InvalidArgumentError(f"{where} must be a table", field="tenants")
    known = {"key", "priority", "requests_per_min", "tokens_per_min", "quota_tokens"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown fields {unknown}; known: {sorted(known)}")
    priority = body.get("priority", Priority.ONLINE.value)
    if priority not in {p.value for p in Priority}:
        raise InvalidArgumentError(
            f"{where}.priority must be one of {[p.value for p in Priority]}", field="priority"
        )
    return Tenant(
        name=name,
        key=_key(body.get("key"), f"{where}.key"),
        priority=Priority(priority),
        requests_per_min=_limit(body.get("requests_per_min"), f"{where}.requests_per_min"),
        tokens_per_min=_limit(body.get("tokens_per_min"), f"{where}.tokens_per_min"),
        quota_tokens=_whole(body.get("quota_tokens"), f"{where}.quota_tokens"),
    )


def _limit(value: Any, where: str) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{where} must be a number > 0", field=where)
    return float(value)


def _whole(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgumentError(f"{where} must be a whole number >= 0", field=where)
    return value


def render_keys(keys: Keys) -> str:
    """A keys file that parses back to `keys` (how a launcher hands them to a child process)."""
    lines = [f"version = {KEYS_VERSION}", f'admin = "{keys.admin}"']
    for t in keys.tenants:
        if t.name == DEFAULT_TENANT:
            continue
        lines += ["", f"[tenants.{t.name}]", f'key = "{t.key}"', f'priority = "{t.priority}"']
        for name in ("requests_per_min", "tokens_per_min", "quota_tokens"):
            value = getattr(t, name)
            if value is not None:
                lines.append(f"{name} = {value!r}")
    return "\n".join(lines) + "\n"


# --- rate limits and quotas ----------------------------------------------------------------------


class QuotaExceededError(EmulatorError):
    """A tenant's quota is spent (not retryable)."""

    default_reason = "QUOTA_EXCEEDED"


class RateLimitedError(EmulatorError):
    """A tenant's rate limit holds the request back (`retry_after_s`: emulated seconds)."""

    default_reason = "RATE_LIMITED"


@dataclass
class _Bucket:
    """A token bucket: what is left of a per-minute limit, refilled as time passes."""

    per_min: float
    level: float  # what is left; refills at per_min a minute up to per_min
    at_s: float

    def refill(self, now_s: float) -> None:
        self.level = min(self.per_min, self.level + (now_s - self.at_s) * self.per_min / 60.0)
        self.at_s = max(self.at_s, now_s)

    def wait_s(self, amount: float) -> float:
        """Emulated seconds until `amount` fits (inf when it never can)."""
        if amount <= self.level:
            return 0.0
        if amount > self.per_min:
            return math.inf
        return (amount - self.level) * 60.0 / self.per_min


@dataclass
class Usage:
    """One tenant's metered use (what `cmemu usage` exports)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    rejected: int = 0  # refused by a rate limit or the quota

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Meter:
    """Admission against each tenant's limits, and what each used. Times are emulated seconds
    (the caller's clock); `admit` then `charge` once the response's usage is known."""

    def __init__(self, tenants: Iterable[Tenant]) -> None:
        self.tenants = {t.name: t for t in tenants}
        self.usage: dict[str, Usage] = {name: Usage() for name in self.tenants}
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}
        self._committed: dict[str, int] = {name: 0 for name in self.tenants}  # admitted, unbilled

    def add(self, tenant: Tenant) -> None:
        if tenant.name not in self.tenants:
            self.tenants[tenant.name] = tenant
            self.usage[tenant.name] = Usage()
            self._committed[tenant.name] = 0

    def _bucket(
        self, table: dict[str, _Bucket], name: str, per_min: float, now_s: float
    ) -> _Bucket:
        bucket = table.get(name)
        if bucket is None:
            bucket = table[name] = _Bucket(per_min=per_min, level=per_min, at_s=now_s)
        bucket.refill(now_s)
        return bucket

    def admit(self, tenant: Tenant, prompt_tokens: int, now_s: float) -> None:
        """Take one request of `prompt_tokens` against the limits, or raise (nothing taken):
        QuotaExceededError, or RateLimitedError with `retry_after_s` in emulated seconds."""
        self.add(tenant)
        use = self.usage[tenant.name]
        quota = tenant.quota_tokens
        if quota is not None:
            spent = use.total_tokens + self._committed[tenant.name]
            if spent + prompt_tokens > quota:
                use.rejected += 1
                raise QuotaExceededError(
                    f"tenant {tenant.name!r} has used {spent:,} of its {quota:,} tokens; this "
                    f"request's prompt alone is {prompt_tokens:,}",
                    subject=tenant.name,
                )
        waits: list[tuple[float, str]] = []
        requests = tokens = None
        if tenant.requests_per_min is not None:
            requests = self._bucket(self._requests, tenant.name, tenant.requests_per_min, now_s)
            waits.append((requests.wait_s(1.0), f"{tenant.requests_per_min:g} requests"))
        if tenant.tokens_per_min is not None:
            tokens = self._bucket(self._tokens, tenant.name, tenant.tokens_per_min, now_s)
            waits.append((tokens.wait_s(prompt_tokens), f"{tenant.tokens_per_min:g} tokens"))
        wait, what = max(waits, default=(0.0, ""))
        if wait > 0:
            use.rejected += 1
            never = math.isinf(wait)
            raise RateLimitedError(
                f"tenant {tenant.name!r} is limited to {what} a minute"
                + (": this request alone is more" if never else ""),
                subject=tenant.name,
                retry_after_s=None if never else wait,
            )
        if requests is not None:
            requests.level -= 1.0
        if tokens is not None:
            tokens.level -= prompt_tokens
        self._committed[tenant.name] += prompt_tokens

    def release(self, tenant: str, admitted_prompt: int) -> None:
        """An admitted request that ended unanswered (refused downstream, failed): nothing is
        billed and its admission stops counting against the quota."""
        self._committed[tenant] -= admitted_prompt

    def charge(
        self,
        tenant: str,
        *,
        admitted_prompt: int,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        now_s: float,
    ) -> None:
        """Bill a finished request (its `usage`); completion tokens drain the token bucket
        after the fact (a later request waits for them)."""
        use = self.usage[tenant]
        use.requests += 1
        use.prompt_tokens += prompt_tokens
        use.cached_tokens += cached_tokens
        use.completion_tokens += completion_tokens
        self._committed[tenant] -= admitted_prompt
        t = self.tenants[tenant]
        if t.tokens_per_min is not None:
            bucket = self._bucket(self._tokens, tenant, t.tokens_per_min, now_s)
            bucket.level -= completion_tokens
