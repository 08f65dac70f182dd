"""The services' gRPC channels to name servers, brokers and checkers: one pool, one set of
options, the SDK's ``CHANNEL_OPTIONS``, and the process's TLS (``services.common.tls``:
plaintext unless the service has a certificate, then TLS presenting it).

What matters most is reconnecting: gRPC's default backoff grows to 120 s, so a channel
that saw its peer die would keep failing for up to two minutes after the peer came back
(a broker restart or a failover would cost minutes, not seconds). With the shared options
a channel tries again within about a second.
"""

from __future__ import annotations

from typing import Any, Iterable

import grpc

from txmq.client import CHANNEL_OPTIONS

from . import tls

_SIZE_OPTIONS = ("grpc.max_send_message_length", "grpc.max_receive_message_length")

#: Client interceptors every channel of this process gets: the service identity's
#: credentials (``services.common.auth.service_credentials``), set once at start-up.
_interceptors: list[Any] = []


def use_credentials(interceptors: list[Any]) -> None:
    """Channels opened from now on carry these credentials on their txmq calls."""
    _interceptors[:] = interceptors


def channel_options(max_message_bytes: int | None = None) -> tuple[tuple[str, Any], ...]:
    """The shared options; ``max_message_bytes`` replaces the SDK's message size limit
    (-1: none)."""
    if max_message_bytes is None:
        return CHANNEL_OPTIONS
    return tuple((k, max_message_bytes if k in _SIZE_OPTIONS else v) for k, v in CHANNEL_OPTIONS)


def open_channel(address: str, max_message_bytes: int | None = None, *,
                 secure: bool | None = None, interceptors: list[Any] | None = None) -> grpc.aio.Channel:
    """One asyncio channel with the shared options (its owner closes it). ``secure``: None,
    TLS with the process's current files when it has TLS, else plaintext; False, plaintext;
    True, TLS (with the system's roots and no client certificate when the process has no TLS).
    ``interceptors``: this channel's own, after the process's (etcd's token: ``etcd``)."""
    options = channel_options(max_message_bytes)
    interceptors = [*_interceptors, *(interceptors or ())] or None
    material = tls.client_tls() if secure is not False else None
    if material is not None:
        material.current()
        return material.aio_channel(address, options, interceptors)
    if secure:
        return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(), options=options,
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def tls_generation() -> int:
    """Grows when the process's TLS files change (0 without TLS): channels opened before
    then should be opened again."""
    material = tls.client_tls()
    return 0 if material is None else material.current()


class ChannelPool:
    """asyncio channels by address, opened on first use, closed together (or as the
    addresses leave, :meth:`retain`). Use from one event loop.

    When the process's TLS files change, :meth:`get` opens new channels with them; the old
    ones stay open for the calls in flight on them until :meth:`close`."""

    def __init__(self, max_message_bytes: int | None = None) -> None:
        self._max_message_bytes = max_message_bytes
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._generation = tls_generation()
        self._retired: list[grpc.aio.Channel] = []

    def get(self, address: str) -> grpc.aio.Channel:
        generation = tls_generation()
        if generation != self._generation:
            self._generation = generation
            self._retired.extend(self._channels.values())
            self._channels = {}
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self._max_message_bytes)
        return channel

    def __contains__(self, address: object) -> bool:
        return address in self._channels

    async def retain(self, addresses: Iterable[str]) -> list[str]:
        """Closes the channels of every address not in ``addresses``; returns those."""
        keep = set(addresses)
        gone = [a for a in self._channels if a not in keep]
        for address in gone:
            await self._channels.pop(address).close()
        return gone

    async def close(self) -> None:
        channels, self._channels = [*self._channels.values(), *self._retired], {}
        self._retired = []
        for channel in channels:
            await channel.close()
