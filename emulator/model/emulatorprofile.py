"""The emulator's own settings in the profile: its bounds on every request and its clock's fidelity.

Not hardware: nothing here is published or estimated for a CloudMatrix. They sit in the profile
beside the hardware (HardwareProfile.limits and .clock) so that one document, overridden the one
way, sets them all and `cmemu hardware` lists them with their source ("assumed").
"""

from __future__ import annotations

from dataclasses import dataclass

from cmemu.emulator.model.provenance import GiB, fig


@dataclass(frozen=True, kw_only=True)
class EmulatorLimits:
    """Knobs of the emulator itself, not of the hardware."""

    # a memory pool holds whole EMS objects of real bytes (up to 64 MiB each, one copy per pool)
    stored_bytes_cap_per_device: int = fig(256 * 2**20, "assumed")
    inline_payload_max_bytes: int = fig(1 * 2**20, "assumed")
    inbox_max_messages: int = fig(1024, "assumed")
    region_alignment: int = fig(4096, "assumed")
    store_page_bytes: int = fig(4096, "assumed")
    collective_detail_max_flows: int = fig(20_000, "assumed")
    telemetry_interval_s: float = fig(10.0, "assumed")  # emulated seconds between samples
    telemetry_max_per_s: float = fig(200.0, "assumed")  # per process: the interval stretches
    event_buffer_max: int = fig(10_000, "assumed")  # per process, while the broker is away
    collective_max_flows: int = fig(2_000_000, "assumed")
    # collectives are timed on the fabric's own threads (never the default pool other work uses)
    collective_workers: int = fig(2, "assumed")
    collective_queue_max: int = fig(16, "assumed")  # waiting beyond these: RESOURCE_EXHAUSTED
    # the fabric keeps the ranks' arrivals of this many recent collectives for the manager's
    # straggler detection (Fabric/ListCollectiveArrivals); one read returns at most this many
    collective_arrivals_kept: int = fig(4096, "assumed")
    # an intermittent-hang's shortest hang and shortest answering gap, emulated: shorter windows
    # would toggle the device (and the fabric's rank fault) faster than any caller could see
    fault_window_min_s: float = fig(0.01, "assumed")
    # clock-skew's bounds: a host clock an hour off is misconfigured, not skewed (NTP refuses to
    # step that far by default: its panic threshold is 1000 s); a 10% rate error is a clock
    # broken beyond any oscillator's tolerance (crystals: tens of ppm), kept for chaos tests
    clock_skew_max_s: float = fig(3600.0, "assumed")
    clock_drift_max_ppm: float = fig(100_000.0, "assumed")
    # Issue 9: a chaos tool must survive chaos. Every request is bounded in time and memory.
    operation_max_s: float = fig(3600.0, "assumed")  # emulated seconds one operation may take
    engine_backlog_max_s: float = fig(86_400.0, "assumed")  # emulated work queued on one die
    process_stored_bytes_cap: int = fig(2 * GiB, "assumed")  # real bytes of all devices held
    process_inbox_max_messages: int = fig(65_536, "assumed")  # queued SENDs, all devices
    process_inbox_max_bytes: int = fig(1 * GiB, "assumed")  # their inline payload bytes
    regions_max_per_device: int = fig(16_384, "assumed")
    list_regions_page_max: int = fig(1000, "assumed")  # ListRegions page size (and default)
    # wall seconds between malloc_trim(0)s of an in-process supernode: what glibc keeps freed
    # inside its heaps goes back to the kernel (emulator/runtime/heap.py); 0: never
    # supernodes the live launchers start (model mode takes up to scaleout.max_supernodes)
    live_supernodes_max: int = fig(8, "assumed")
    heap_trim_interval_s: float = fig(10.0, "assumed")
    # Issue 21: the OpenAI endpoint refuses what no real deployment would take (400 or 413 with
    # the limit named), before any of it reaches the engine or EMS.
    http_body_max_bytes: int = fig(8 * 2**20, "assumed")  # 413 beyond
    http_line_max_bytes: int = fig(65_536, "assumed")  # the request line (its path)
    http_header_max_bytes: int = fig(8190, "assumed")  # one header field (aiohttp's default)
    http_headers_max: int = fig(100, "assumed")  # header fields per request
    http_idle_s: float = fig(75.0, "assumed")  # wall seconds a silent keep-alive connection lives
    # wall seconds a token may leave after the wall clock reached its emulated instant and still
    # count as on pace (responses say `kept_pace` by it)
    release_lag_tolerance_s: float = fig(0.05, "assumed")
    json_depth_max: int = fig(64, "assumed")  # nesting of arrays and objects in a request body
    prompt_bytes_max: int = fig(4 * 2**20, "assumed")  # UTF-8 bytes of prompt text per request
    content_parts_max: int = fig(1024, "assumed")  # content parts of all messages together
    messages_max: int = fig(4096, "assumed")  # messages of one chat request
    choices_max: int = fig(128, "assumed")  # prompts x n of one request
    # output tokens one answer may ask for (and the default without max_tokens, when the
    # context leaves more room): DeepSeek's own API caps R1's answers at 64K tokens
    max_tokens_max: int = fig(65_536, "assumed")
    stop_max: int = fig(16, "assumed")  # stop sequences (OpenAI allows 4; vLLM more)
    stop_chars_max: int = fig(1000, "assumed")  # characters of one stop sequence


@dataclass(frozen=True, kw_only=True)
class ClockProfile:
    """How emulated time keeps pace with the emulator (emulator/engines/clock.py and
    governor.py): not hardware, the emulator's own fidelity. The asked time scale is a ceiling;
    the clock runs slower when a process's event loop cannot keep up, so a busy host is never
    read as a failed device."""

    dilation: bool = fig(True, "assumed")  # off: emulated time is wall time x time_scale
    tick_s: float = fig(0.01, "assumed")  # wall seconds between two lag measurements
    # wall seconds between a follower's ticks while its loop idles and keeps the asked rate: a
    # 100 Hz asyncio.sleep alone costs 1.2% of a core, 7 cores idle for cm384's 633 processes
    idle_tick_s: float = fig(0.1, "assumed")
    # of a core: a follower that spent more of its last window on CPU ticks at tick_s again
    idle_cpu_share: float = fig(0.02, "assumed")
    window_s: float = fig(0.5, "assumed")  # wall seconds of ticks behind one rate decision
    lag_quantile: float = fig(0.9, "assumed")  # of the window's tick lateness: the lag
    # emulated seconds a loop may run late: the rate is at most lag_budget_s / lag
    lag_budget_s: float = fig(0.1, "assumed")
    lag_floor_s: float = fig(0.0005, "assumed")  # wall: below this a lag is timer noise
    min_rate: float = fig(0.01, "assumed")  # emulated seconds per wall second, at the slowest
    raise_factor: float = fig(1.25, "assumed")  # the rate rises by at most this per window
    # wall seconds a stalled owner of time lets readers run on before time stands still
    horizon_s: float = fig(0.1, "assumed")
    lease_s: float = fig(1.0, "assumed")  # wall: how far a follower may read past the last word
    stale_s: float = fig(3.0, "assumed")  # wall: a process silent this long no longer slows time
    # wall: a follower whose stream from the authority (which speaks every lease_s / 4) is silent
    # this long drops it and connects anew (a partition can leave a stream open and dead)
    follower_silence_s: float = fig(10.0, "assumed")
    # wall: the oldest issue stamp the fabric times a transfer from (at the rate of the moment):
    # a request's transit is not its transfer's, but a stamp older than any transit is its
    # sender's wrong clock (clock-skew behind), and would get the transfer done in the past
    stamp_max_age_s: float = fig(1.0, "assumed")
