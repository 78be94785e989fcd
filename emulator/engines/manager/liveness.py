"""The cluster manager's detection: the liveness stream of every process of its supernode,
judged in emulated time (the streams' beats: engines/device/liveness.py).

- A device in a beat's `unreachable` (crashed) or `down` (NOT_SERVING) fails at once; a die in
  `dies_down` fails, and answers again once a beat no longer lists it. A device in `ecc`
  (uncorrectable memory errors) is degraded: it answers, but what it holds is lost, so it goes
  out of service (an incident detected_by "ecc") until a beat no longer lists it.
- A device missing from `answering` (hung) fails once `misses_to_fail` heartbeat intervals
  passed since it last answered, both by its process's stamps and by the manager's own time of
  receipt: the beats say how much time passed at the device, so the manager's own lag can never
  look like the device's silence, and the manager's receipt bounds it, so a process whose clock
  jumps ahead (clock-skew) cannot make a brief hang look long. A clock stepped behind delays
  the verdict by its step at most (the beats say less time passed), never fails a device.
- A stream that falls silent for `misses_to_fail` intervals of emulated time (a stopped process)
  fails every device it covers, once a short wall-clock grace confirms the silence (beats the
  manager had not read yet, after a stall of its own, end it); it is then opened again on a new
  connection, and again every `REOPENED_WALL_S` until a beat comes (a partitioned container's
  return is seen within seconds of it).
- An open that brings no first beat within `FIRST_BEAT_WALL_S` of wall time (a beat comes at
  once on an open, whatever emulated time does) hangs, and is dropped and opened again on a new
  connection; a cancelled read that does not end is abandoned with its channel. Neither is a
  verdict on the device, and neither waits on emulated time (which a restart elsewhere may be
  holding), so a stream that came back is always followed again.
- A stream that breaks (a killed process, or the device it was opened through crashed) is
  opened again through another device it covers; each device that refuses the connection fails
  as unreachable.
- Neither silence nor a refusal fails anything while more than `cut_off_share` of the devices
  are silent at once: the manager suspects itself cut off (a partition of the manager) and says
  so (`on_cut_off`), until enough of them speak again.
Streams are opened one per process: the first beat says which devices a stream covers, and no
other stream is opened for them. In one process that is one stream, whatever the supernode's
size; with one process per node, one per node.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import FIRST_COMPLETED
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from cmemu.emulator.engines.clock import Timeline
from cmemu.emulator.engines.device.liveness import Beat
from cmemu.emulator.engines.peers import Directory
from cmemu.emulator.model.errors import EmulatorError
from cmemu.emulator.model.manager.detector import ECC, FAILED, Detector, Incident
from cmemu.emulator.model.topology import Device

log = structlog.get_logger("cmemu.manager")
# The verdicts here are emulated (`misses_to_fail` heartbeat intervals of silence); these four
# bounds stay wall because each is about a connection or this process, never about the device,
# and none fails anything by running out.
# A stream that cannot be opened is tried again this much later: pacing of this process's
# retries, not a judgement.
REOPEN_WALL_S = 0.5
# A grace after the emulated silence, before it fails the stream's devices: beats already
# received that this manager's own stalled loop has not read yet end it. A stall of this
# process is measured in wall time, and the grace only ever delays a verdict.
CONFIRM_WALL_S = 1.0
# A silent stream's reopening that brings no beat within this much wall time is dropped and
# opened again: an open can hang (a connection made as a partition ends, a call waiting for a
# channel that will not connect), and nothing else would ever end it. Wall: its devices are
# failed already, and emulated time may be held meanwhile (a restart elsewhere holds it).
REOPENED_WALL_S = 5.0
# A stream's first beat comes as soon as it is opened (engines/device/liveness.py), whatever
# emulated time does: an open that brings none within this much wall time hangs (a connection
# made as a partition ends, a name looked up while its container was away) and is dropped and
# opened again on a new connection, the bound doubling (to 16x) while opens keep hanging, so
# a host too slow for it still gets its stream. Failing nothing: only silence and refusals do.
FIRST_BEAT_WALL_S = 5.0
UNREACHABLE = "PEER_UNREACHABLE"


@dataclass(eq=False)
class _Stream:
    """One process's liveness stream to the manager: when it last beat and what it answered for."""

    covers: tuple[str, ...]
    last_beat_ns: int = 0  # the manager's emulated time at the last beat
    answered_ns: dict[str, int] = field(default_factory=dict)  # the process's time, per device
    answered_here_ns: dict[str, int] = field(default_factory=dict)  # the manager's, the same
    dies_down: set[str] = field(default_factory=set)
    ecc: set[str] = field(default_factory=set)
    beat: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    reset: asyncio.Event = field(default_factory=asyncio.Event)  # silent: drop its connection
    hung_opens: int = 0  # opens in a row that brought no first beat
    refused: int = 0  # opens in a row that ended with an error before a beat


def _log_ended(stream: _Stream, through: str, exc: EmulatorError, *, answered: bool) -> None:
    """A stream that ended with the peer's error. One that keeps being refused before a beat is
    told of at info at its 1st, 10th and every 100th refusal in a row (not every half second):
    what keeps a device away (a name not found, a connection refused) is what an operator needs."""
    stream.refused = 0 if answered else stream.refused + 1
    if stream.refused in (1, 10) or (stream.refused and stream.refused % 100 == 0):
        log.info("liveness stream refused", through=through, opens=stream.refused,
                 error=str(exc)[:300])  # fmt: skip
    else:
        log.debug("liveness stream ended", through=through, error=str(exc)[:200])


class LivenessWatch:
    """Detection over liveness streams. `on_incident` hears each failure, `on_back` each
    device or die that answers again."""

    def __init__(
        self,
        *,
        devices: Mapping[str, Device],
        peers: Directory,
        clock: Timeline,
        detector: Detector,
        interval_s: float,
        misses_to_fail: int,
        on_incident: Callable[[Incident], None],
        on_back: Callable[[str], None],
        cut_off_share: float = 1.0,
        on_cut_off: Callable[[bool, int], None] | None = None,
    ) -> None:
        self.devices = dict(devices)
        self.peers = peers
        self.clock = clock
        self.detector = detector
        self.interval_ns = round(interval_s * 1e9)
        self.silence_ns = misses_to_fail * self.interval_ns
        self.on_incident = on_incident
        self.on_back = on_back
        self.cut_off_share = cut_off_share
        self.on_cut_off = on_cut_off
        self.cut_off = False  # the manager suspects itself cut off: silence fails no device
        self.covered: dict[str, _Stream] = {}
        self.beats = 0  # beats received
        self.streams = 0  # streams opened
        self.hung_opens = 0  # opens dropped for bringing no first beat (FIRST_BEAT_WALL_S)
        self._abandoned: set[asyncio.Future[None]] = set()  # reads that outlived their cancel

    async def run(self) -> None:
        """Open a stream for the first device no stream covers, until every one is covered;
        keep them open."""
        async with asyncio.TaskGroup() as tasks:
            for device in self.devices:
                if device in self.covered:
                    continue
                stream = _Stream(covers=(device,))
                self.covered[device] = stream
                tasks.create_task(self._stream(stream), name=f"liveness-{device}")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(REOPEN_WALL_S * 4):
                        await stream.opened.wait()  # its first beat says what it covers

    async def _stream(self, stream: _Stream) -> None:
        """One process's stream, reopened through another device it covers when it breaks,
        its silence judged alongside."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._silence(stream))
            while True:
                # devices not known failed first; a failed one may be back: tried last
                order = sorted(stream.covers, key=lambda d: self.detector.devices.get(d) == FAILED)
                for through in order:
                    if await self._follow(stream, through):
                        break  # it answered, then broke: start again from the first
                else:
                    await asyncio.sleep(REOPEN_WALL_S)

    async def _follow(self, stream: _Stream, through: str) -> bool:
        """Follow the stream opened through `through` until it breaks, or until its silence
        fails its devices (then its transport is dropped: a partition drops packets, and a call
        on a connection nobody answers waits for TCP's timeout, minutes); False when it could
        not be opened."""
        device = self.devices[through]
        answered = [False]

        async def read() -> None:
            async for beat in self.peers.device(device).watch_liveness():
                if not answered[0]:
                    if through not in beat.covers:  # its name now leads to another process
                        await self._elsewhere(through, beat)
                        return
                    answered[0] = True
                    if stream.opened.is_set():
                        log.info("liveness stream back", through=through, process=beat.process)
                    self._cover(stream, beat)
                self._judge(stream, beat)
                if self.cut_off:
                    self._cut_off()  # rejoined once enough of the supernode speaks again

        stream.reset.clear()
        reading = asyncio.ensure_future(read())
        resetting = asyncio.ensure_future(stream.reset.wait())
        try:
            either = {reading, resetting}
            first = FIRST_BEAT_WALL_S * 2 ** min(stream.hung_opens, 4)
            done, _ = await asyncio.wait(either, timeout=first, return_when=FIRST_COMPLETED)
            if not done and not answered[0]:  # opened, and not even its first beat came
                stream.hung_opens += 1
                self.hung_opens += 1
                log.info("liveness stream open hung: reopened", through=through, after_s=first)
            elif not done:
                stream.hung_opens = 0
                await asyncio.wait(either, return_when=FIRST_COMPLETED)
        finally:
            resetting.cancel()
            if not reading.done():
                reading.cancel()
                await self._abandon(reading)
        if not reading.done() or reading.cancelled():  # silent: anew, on a new connection
            await self.peers.forget(device)
            return answered[0]
        exc = reading.exception()
        if isinstance(exc, EmulatorError):
            if (exc.reason == UNREACHABLE or answered[0]) and not self._cut_off():
                what = "broken" if answered[0] else "refused"
                self._fail(through, "health", f"liveness stream {what}: {exc.reason}")
            _log_ended(stream, through, exc, answered=answered[0])
            if exc.reason == UNREACHABLE:
                # the next try on a new channel: one that failed to look a partitioned
                # container's name up backs off up to 120 s before it looks again (ClockStream)
                await self.peers.forget(device)
        elif exc is not None:  # not the peer's answer: one stream's bug ends no detection
            log.error("liveness stream failed", through=through, exc_info=exc)
            await self.peers.forget(device)
            await asyncio.sleep(REOPEN_WALL_S)
        return answered[0]

    async def _abandon(self, reading: asyncio.Future[None]) -> None:
        """Wait a bounded while for a cancelled read to end. A read parked in a call whose
        connection is gone may not end until its channel is closed (which the caller does
        next): waiting for it unbounded would never open the stream again."""
        await asyncio.wait({reading}, timeout=FIRST_BEAT_WALL_S)
        if not reading.done():
            log.info("liveness read did not end when cancelled: its channel is closed")
            self._abandoned.add(reading)
            reading.add_done_callback(self._abandoned.discard)

    async def _elsewhere(self, through: str, beat: Beat) -> None:
        """A stream opened through `through` answered for other devices: a container that came
        back took the address `through` had (a restart, a reconnect) and the channel still
        holds it. That process's devices are not `through`'s: `through` is unreachable until
        its name, looked up again, leads to it."""
        self._fail(through, "health", f"unreachable: its address answers as {beat.process}")
        log.info("liveness stream reached another process", through=through, process=beat.process)
        await self.peers.forget(self.devices[through])

    @property
    def devices_covered(self) -> int:
        """Devices a stream has reported on (every one, once the streams are open)."""
        return sum(1 for s in set(self.covered.values()) if s.opened.is_set() for _ in s.covers)

    def _cover(self, stream: _Stream, beat: Beat) -> None:
        self.streams += 1
        stream.covers = tuple(d for d in beat.covers if d in self.devices) or stream.covers
        for device in stream.covers:
            self.covered[device] = stream
        stream.opened.set()

    def _judge(self, stream: _Stream, beat: Beat) -> None:
        self.beats += 1
        here = stream.last_beat_ns = self.clock.now_ns()
        stream.beat.set()
        unreachable, down, answering = set(beat.unreachable), set(beat.down), set(beat.answering)
        for device in stream.covers:
            if device in unreachable:
                self._fail(device, "health", "unreachable: its server is gone")
            elif device in down:
                self._fail(device, "health", "health: NOT_SERVING")
            elif device in answering:
                stream.answered_ns[device] = beat.emulated_ns
                stream.answered_here_ns[device] = here
                self._answered(device)
            else:  # hung: judged on the time that passed at the device and here, the shorter
                since = stream.answered_ns.setdefault(device, beat.emulated_ns)
                since_here = stream.answered_here_ns.setdefault(device, here)
                silent = min(beat.emulated_ns - since, here - since_here)
                self.detector.suspect(device)
                if silent >= self.silence_ns:
                    missed = silent // self.interval_ns
                    self._fail(device, "heartbeat", f"{missed} heartbeats missed: not answering")
        dies_down = set(beat.dies_down)
        for die in dies_down:
            self._fail(die, "health", "health: NOT_SERVING")
        for die in stream.dies_down - dies_down:
            self._answered(die)
        stream.dies_down = dies_down
        ecc = set(beat.ecc) & set(stream.covers)
        for device in ecc:
            incident = self.detector.degraded(
                device, self.clock.now_ns(), "uncorrectable HBM ECC errors: its data is lost",
                by=ECC,
            )  # fmt: skip
            if incident is not None:
                self.on_incident(incident)
        for device in stream.ecc - ecc:
            if self.detector.recovered(device, ECC):
                self.on_back(device)
        stream.ecc = ecc

    async def _silence(self, stream: _Stream) -> None:
        """No beat for `misses_to_fail` intervals of emulated time: the process is stopped."""
        await stream.opened.wait()
        while True:
            stream.beat.clear()
            if await self.clock.wait(stream.beat, stream.last_beat_ns + self.silence_ns):
                continue
            with contextlib.suppress(TimeoutError):  # beats this manager has not read yet
                async with asyncio.timeout(CONFIRM_WALL_S):
                    await stream.beat.wait()
                    continue
            if not self._cut_off():
                for device in stream.covers:
                    self._fail(device, "heartbeat", "no liveness: its process stopped answering")
            log.info("liveness stream silent: reopened", covers=list(stream.covers))
            while True:  # opened again, on a new connection, until it speaks again
                stream.reset.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(REOPENED_WALL_S):
                        await stream.beat.wait()
                        break

    def _cut_off(self) -> bool:
        """More than `cut_off_share` of the watched devices are on streams with no beat for two
        intervals: the silence is more likely the manager's own (a partition of its host) than
        theirs, and failing them all would take a healthy supernode out of service. In one
        process every device is on one stream: its silence is always the manager's own."""
        now, quiet_after = self.clock.now_ns(), 2 * self.interval_ns
        streams = set(self.covered.values())
        quiet = sum(len(s.covers) for s in streams if now - s.last_beat_ns > quiet_after)
        cut = quiet > self.cut_off_share * len(self.devices)
        if cut != self.cut_off:
            self.cut_off = cut
            log.warning("cut off" if cut else "rejoined", quiet=quiet, devices=len(self.devices))
            if self.on_cut_off is not None:
                self.on_cut_off(cut, quiet)
        return cut

    def _answered(self, target: str) -> None:
        if self.detector.answered(target):
            self.on_back(target)

    def _fail(self, target: str, by: str, detail: str) -> None:
        incident = self.detector.unhealthy(target, by, self.clock.now_ns(), detail)
        if incident is not None:
            self.on_incident(incident)
