"""One shared gRPC channel per address, whatever the number of callers.

Used by typed clients outside the emulator and by devices reaching each other (services.peers),
so both open their channels with the same options and close them the same way.
"""

from __future__ import annotations

import grpc

from emulator.client.credentials import ANONYMOUS, Credentials

MESSAGE_MAX_BYTES = 8 * 2**20  # room for a 1 MiB inline payload and batch replies
CLIENT_OPTIONS = (
    ("grpc.max_receive_message_length", MESSAGE_MAX_BYTES),
    ("grpc.max_send_message_length", MESSAGE_MAX_BYTES),
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

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)
