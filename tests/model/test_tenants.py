"""Tenants as data and arithmetic: the token file and the keys file, rate limits as token buckets
on the emulated clock, quotas, and what is billed."""

from __future__ import annotations

import math

import pytest

from cmemu.emulator.model.errors import InvalidArgumentError
from cmemu.emulator.model.tenants import (
    DEFAULT_TENANT,
    Meter,
    Priority,
    QuotaExceededError,
    RateLimitedError,
    Tenant,
    parse_keys,
    render_keys,
)

ADMIN = "admin-key-0123456789"
KEYS = f"""
version = 1
admin = "{ADMIN}"

[tenants.acme]
key = "acme-key-0123456789"
priority = "online"
requests_per_min = 60
tokens_per_min = 1000

[tenants.batch]
key = "batch-key-0123456789"
priority = "offline"
quota_tokens = 500
"""


def test_a_token_file_is_one_tenant() -> None:
    keys = parse_keys("  tok-en_123\n", "t")
    assert keys.admin == "tok-en_123"
    assert keys.names() == [DEFAULT_TENANT]
    assert keys.tenant("tok-en_123") == keys.tenants[0]
    assert keys.tenant("other") is None


def test_a_keys_file() -> None:
    keys = parse_keys(KEYS, "k")
    assert keys.names() == [DEFAULT_TENANT, "acme", "batch"]
    acme = keys.tenant("acme-key-0123456789")
    assert acme is not None and acme.name == "acme" and acme.requests_per_min == 60.0
    batch = keys.tenant("batch-key-0123456789")
    assert batch is not None and batch.priority is Priority.OFFLINE and batch.quota_tokens == 500
    assert keys.tenant(ADMIN) == keys.tenants[0]
    assert parse_keys(render_keys(keys), "again") == keys


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "one token is wanted"),
        ("two tokens", "one token is wanted"),
        ("version = 2", "version '2' unsupported"),
        ('version = 1\nadmin = "short"', "at least 16"),
        (f'version = 1\nadmin = "{ADMIN}"\nextra = 1', "unknown fields ['extra']"),
        (f'version = 1\nadmin = "{ADMIN}"\n[tenants.Bad_Name]\nkey = "{ADMIN}x"', "tenant name"),
        (f'version = 1\nadmin = "{ADMIN}"\n[tenants.default]\nkey = "{ADMIN}x"', "tenant name"),
        (f'version = 1\nadmin = "{ADMIN}"\n[tenants.a]\nkey = "{ADMIN}"', "share a key"),
        (
            f'version = 1\nadmin = "{ADMIN}"\n[tenants.a]\nkey = "{ADMIN}x"\npriority = "now"',
            "priority must be one of",
        ),
        (
            f'version = 1\nadmin = "{ADMIN}"\n[tenants.a]\nkey = "{ADMIN}x"\nrequests_per_min = 0',
            "must be a number > 0",
        ),
        (f'version = 1\nadmin = "{ADMIN}"\n[tenants.a]\nkey = "quote\\"d-key-0123456"', "quotes"),
    ],
)
def test_bad_files_are_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        parse_keys(text, "keys.toml")
    assert says in str(err.value) and "keys.toml" in str(err.value)


def test_rate_limits_refill_over_emulated_time() -> None:
    acme = Tenant(name="acme", key="k" * 16, requests_per_min=2, tokens_per_min=100)
    meter = Meter([acme])
    meter.admit(acme, 10, now_s=0.0)
    meter.admit(acme, 10, now_s=0.0)
    with pytest.raises(RateLimitedError) as err:  # the third request of the minute
        meter.admit(acme, 10, now_s=0.0)
    assert err.value.retry_after_s == pytest.approx(30.0)  # one request refills in 30 s
    meter.admit(acme, 10, now_s=30.0)
    tokens = Tenant(name="tokens", key="t" * 16, tokens_per_min=100)
    meter.admit(tokens, 70, now_s=0.0)
    with pytest.raises(RateLimitedError) as err:  # 30 left: 20 more refill in 12 s
        meter.admit(tokens, 50, now_s=0.0)
    assert err.value.retry_after_s == pytest.approx(12.0)
    meter.admit(tokens, 50, now_s=12.0)
    assert meter.usage["acme"].rejected == 1 and meter.usage["tokens"].rejected == 1
    with pytest.raises(RateLimitedError) as never:  # more than a minute's worth: no retry helps
        meter.admit(tokens, 101, now_s=600.0)
    assert never.value.retry_after_s is None


def test_completion_tokens_drain_the_bucket_after_the_fact() -> None:
    acme = Tenant(name="acme", key="k" * 16, tokens_per_min=100)
    meter = Meter([acme])
    meter.admit(acme, 10, now_s=0.0)
    meter.charge(
        "acme", admitted_prompt=10, prompt_tokens=10, cached_tokens=4, completion_tokens=80,
        now_s=0.0,
    )  # fmt: skip
    with pytest.raises(RateLimitedError) as err:
        meter.admit(acme, 20, now_s=0.0)
    assert err.value.retry_after_s == pytest.approx(6.0)
    use = meter.usage["acme"]
    assert (use.requests, use.prompt_tokens, use.cached_tokens, use.completion_tokens) == (
        1, 10, 4, 80,
    )  # fmt: skip
    assert use.total_tokens == 90


def test_a_quota_is_a_hard_total() -> None:
    batch = Tenant(name="batch", key="k" * 16, priority=Priority.OFFLINE, quota_tokens=100)
    meter = Meter([batch])
    meter.admit(batch, 60, now_s=0.0)
    with pytest.raises(QuotaExceededError):  # 60 admitted, not yet billed, count already
        meter.admit(batch, 50, now_s=0.0)
    meter.release("batch", 60)  # that one failed: nothing billed, nothing held
    meter.admit(batch, 50, now_s=0.0)
    meter.charge(
        "batch", admitted_prompt=50, prompt_tokens=50, cached_tokens=0, completion_tokens=40,
        now_s=1.0,
    )  # fmt: skip
    with pytest.raises(QuotaExceededError) as err:
        meter.admit(batch, 11, now_s=math.inf)  # time does not refill a quota
    assert err.value.retry_after_s is None and "90 of its 100" in str(err.value)
    meter.admit(batch, 10, now_s=0.0)  # exactly the rest fits


def test_priority_classes_are_ordered() -> None:
    assert [p.rank for p in Priority] == [0, 1, 2]
    assert Priority("near-line") is Priority.NEAR_LINE
