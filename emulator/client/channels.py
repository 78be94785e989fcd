"""One shared gRPC channel per address, whatever the number of callers.

Used by typed clients outside the emulator and by devices reaching each other
(cmemu.services.peers), so both open their channels with the same options and close them the
same way.
"""

from __future__ import annotations

import grpc

from cmemu.emulator.client.credentials import ANONYMOUS, Credentials

RECONNECT_BACKOFF_MS = 1000
MESSAGE_MAX_BYTES = 8 * 2**20  # room for a 1 MiB inline payload and batch replies
# A connection whose packets vanish (a partitioned container, a host gone) is found dead by an
# unanswered HTTP/2 ping within KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS of wall time, not by
# TCP's retransmission timeout (about 15 minutes): its streams (the clock's, the manager's
# liveness watch) end UNAVAILABLE and are opened again on a new connection. Pings are answered
# by gRPC's transport threads, not by the event loop, so a busy host does not fail them; the
# timeout is generous all the same. Servers must permit these pings (SERVER_KEEPALIVE_OPTIONS).
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 10_000
CLIENT_OPTIONS = (
    ("grpc.max_receive_message_length", MESSAGE_MAX_BYTES),
    ("grpc.max_send_message_length", MESSAGE_MAX_BYTES),
    # A crashed device comes back (fault kind crash): reconnect within a second of wall time,
    # not after gRPC's default backoff of up to 120 s (20 emulated minutes at time scale 10).
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    # A restarted or reconnected container may come back at another address: its name is looked
    # up again a second after a failed connection, not 30 s (gRPC's default)
    ("grpc.dns_min_time_between_resolutions_ms", RECONNECT_BACKOFF_MS),
    # and a lookup nobody answers (a container cut off from its networks asks a DNS server it
    # cannot reach) fails after 5 s, not gRPC's default 120 s, during which its calls wait
    ("grpc.dns_ares_query_timeout", 5000),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),  # gRPC >= 1.6x: else 60 s
    ("grpc.keepalive_permit_without_calls", 1),  # an idle channel's next call finds it alive
    ("grpc.http2.max_pings_without_data", 0),  # a quiet stream is pinged all the same
    # A channel's connections are its own: gRPC otherwise shares one subchannel per address in
    # the whole process, so a new channel to a server started again on the same port (a new
    # emulator on the same block, in the same test process) inherited the old one's refused
    # connection and its backoff: "failed to connect ... Connection refused" for up to a second
    # against a server that was serving (CI, tests/services/test_ub.py)
    ("grpc.use_local_subchannel_pool", 1),
)
SERVER_KEEPALIVE_OPTIONS = (
    # Without these a server answers a client pinging every 10 s with GOAWAY ("too many pings")
    # after two strikes, which would end every long stream each 20-30 s.
    ("grpc.keepalive_permit_without_calls", 1),
    # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS: the macro's name is not its key (an
    # unknown key is ignored: "min_recv_ping..." left the default, 5 minutes, in force)
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
)


class Channels:
    """Every channel opened with one Credentials: the same token and CA for all."""

    def __init__(self, credentials: Credentials = ANONYMOUS) -> None:
        self.credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self.credentials.channel(address, CLIENT_OPTIONS)
            self._channels[address] = channel
        return channel

    async def reset(self, address: str) -> None:
        """Close the channel to `address`: the next get() opens one that resolves the name
        again (a container that came back may have another container's old IP address)."""
        channel = self._channels.pop(address, None)
        if channel is not None:
            await channel.close(None)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)
