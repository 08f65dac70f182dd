"""Credentials on calls: ``authorization: Bearer <token>`` on every call of a sync channel
(:func:`with_token`) or an asyncio one (:func:`aio_bearer_interceptors`).

The public home of ``txmq._auth`` (what services and tools import)."""

from ._auth import BearerToken, aio_bearer_interceptors, with_token  # re-exported

__all__ = ["BearerToken", "aio_bearer_interceptors", "with_token"]
