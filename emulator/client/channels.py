"""One shared gRPC channel per address, whatever the number of callers.

Used by typed clients outside the emulator and by devices reaching each other (services.peers),
so both open their channels with the same options and close them the same way.
"""

from __future__ import annotations

import grpc

from emulator.client.credentials import ANONYMOUS, Credentials

RECONNECT_BACKOFF_MS = 1000
MESSAGE_MAX_BYTES = 8 * 2**20  # room for a 1 MiB inline payload and batch replies
CLIENT_OPTIONS = (
    ("grpc.max_receive_message_length", MESSAGE_MAX_BYTES),
    ("grpc.max_send_message_length", MESSAGE_MAX_BYTES),
    # A crashed device comes back (fault kind crash): reconnect within a second of wall time,
    # not after gRPC's default backoff of up to 120 s (20 emulated minutes at time scale 10).
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
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
