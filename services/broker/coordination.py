"""A replicated shard's state in etcd: who leads it (under a lease) and its in-sync set.

etcd is the only consensus in txmq. Per shard, under ``<prefix>/shards/<shard>/``:

- ``leader``: ``{"replica": id, "address": "host:port", "replication": "host:port"}``
  (its gRPC address and its replication stream's, ``transport.py``), attached to the leader's lease,
  so it disappears when the leader stops renewing it. Its create revision is the
  **leader epoch**: a fencing token that grows with every election (etcd revisions only
  grow), carried on every replication message.
- ``isr``: ``{"members": [ids], "epoch": E}``, the in-sync replicas, written only by a
  compare-and-swap on its mod revision that also requires the writer still to lead.
- ``handover``: ``{"to": id}``, under a short lease: a leader moving its leadership on
  purpose (``txmq broker elect``) deletes its key and names the replica that should
  campaign; the others hold back while it exists.

A replica campaigns with one transaction: the leader key is absent, the in-sync set is the
one it read (and names it); then it creates the leader key under its lease and removes the
old leader from the in-sync set (while at least ``min_insync`` members remain). Founding a
shard (no in-sync set yet) is the same transaction with the set created as {itself}.

The client is aetcd's generated etcd v3 stubs on a channel with the services' shared options
(``services.common.channels``), so reconnection is fast (gRPC's default backoff grows to
two minutes). An ``https://`` endpoint is dialed with TLS, presenting the broker's own
certificate (``TXMQ_TLS_*``; etcd's ``--client-cert-auth`` checks it, and with etcd's
authentication on its common name is the etcd user); ``http://`` or none is plaintext, with
a password user when ``etcd_user`` is set (``services.common.etcd``). The channel is opened
again when the TLS files change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Awaitable, Callable

import grpc
from aetcd import rpc

from services.common.channels import open_channel, tls_generation
from services.common.etcd import EtcdCredentials, token_interceptors

from .replica.state import InSync, Leader, ShardState

__all__ = ["EtcdUnavailable", "InSync", "Leader", "ShardCoordinator", "ShardState"]

log = logging.getLogger(__name__)


class EtcdUnavailable(Exception):
    """etcd did not answer (the replica cannot tell whether it may lead)."""


class ShardCoordinator:
    """One replica's view of its shard in etcd. Every method raises
    :class:`EtcdUnavailable` when etcd cannot be reached within ``timeout``."""

    def __init__(self, endpoints: tuple[str, ...], prefix: str, shard: str, replica_id: int,
                 timeout_seconds: float = 2.0, credentials: EtcdCredentials | None = None) -> None:
        self.endpoints = endpoints
        #: etcd's password authentication (None: none, or mTLS: the certificate is the user).
        self.credentials = credentials
        self.shard = shard
        self.replica_id = replica_id
        self.timeout = timeout_seconds
        base = f"{prefix.rstrip('/')}/shards/{shard}/".encode()
        self.leader_key = base + b"leader"
        self.isr_key = base + b"isr"
        self.handover_key = base + b"handover"
        self._endpoint = 0
        self._channel: grpc.aio.Channel | None = None
        self._kv: rpc.KVStub | None = None
        self._lease: rpc.LeaseStub | None = None
        self._tls_generation = 0
        self._retired: list[grpc.aio.Channel] = []
        self.lease_id = 0
        self._ttl = 1
        #: When the lease was last granted or renewed (time.monotonic()).
        self.renewed_at = 0.0
        self._closed = False

    # --- connection -------------------------------------------------------------------------

    def _stubs(self) -> tuple[rpc.KVStub, rpc.LeaseStub]:
        if self._closed:
            # A call after close() must not open a channel nobody closes (a stopping
            # process would keep it, and its calls, past its end).
            raise EtcdUnavailable("the shard coordinator is closed (the replica is stopping)")
        if self._channel is not None and self._tls_generation != tls_generation():
            self._retired.append(self._channel)  # rotated TLS files: calls in flight finish on it
            self._channel = None
        if self._channel is None:
            address = self.endpoints[self._endpoint % len(self.endpoints)]
            self._tls_generation = tls_generation()
            secure = address.startswith("https://")  # else plaintext, whatever the broker's TLS
            # The interceptors read the channel at call time: it is set just below.
            auth = (token_interceptors(self.credentials, lambda: self._channel, self.timeout)  # type: ignore[arg-type,return-value]
                    if self.credentials is not None else None)
            self._channel = open_channel(address.removeprefix("https://").removeprefix("http://"), secure=secure,
                                         interceptors=auth)
            self._kv = rpc.KVStub(self._channel)
            self._lease = rpc.LeaseStub(self._channel)
        assert self._kv is not None and self._lease is not None
        return self._kv, self._lease

    async def _failed(self, exc: BaseException) -> EtcdUnavailable:
        # Try the next endpoint next time.
        if len(self.endpoints) > 1 and self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._endpoint += 1
        return EtcdUnavailable(f"etcd {self.endpoints}: {exc}")

    async def close(self) -> None:
        self._closed = True
        retired, self._retired = self._retired, []
        for channel in retired:
            await channel.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _txn(self, request: rpc.TxnRequest) -> rpc.TxnResponse:
        kv, _lease = self._stubs()
        try:
            return await kv.Txn(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise await self._failed(exc) from None

    # --- lease ------------------------------------------------------------------------------

    async def grant_lease(self, ttl_seconds: int) -> int:
        _kv, lease = self._stubs()
        try:
            reply = await lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl_seconds), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise await self._failed(exc) from None
        lease_id: int = reply.ID
        self.lease_id = lease_id
        self.renewed_at = time.monotonic()
        self._ttl = ttl_seconds
        return lease_id

    async def acquire_lease(self, ttl_seconds: int, retry_seconds: float) -> None:
        """Grants this replica's lease, asking again every ``retry_seconds`` while etcd does
        not answer (a replica starting while etcd is down waits for it)."""
        while True:
            try:
                await self.grant_lease(ttl_seconds)
                return
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable, retrying", extra={"fields": {"error": str(exc)[:200]}})
                await asyncio.sleep(retry_seconds)

    async def hold_lease(self, on_expired: Callable[[], Awaitable[None]]) -> None:
        """Renews the lease every third of its TTL until cancelled (:attr:`renewed_at` says
        when it last was). Found expired, ``on_expired()`` runs (a leader steps down) and a
        new lease is granted. Nothing but cancellation ends it: a replica whose lease task
        died would never campaign again (every campaign names the lost lease)."""
        ttl = self._ttl
        while True:
            await asyncio.sleep(max(ttl / 3, 0.1))
            try:
                left = await self.keep_alive()
            except EtcdUnavailable as exc:
                log.warning("lease renewal failed", extra={"fields": {"error": str(exc)[:200]}})
                continue
            except asyncio.CancelledError:
                raise
            except Exception:  # logged; the next round tries again
                log.exception("lease renewal failed unexpectedly")
                continue
            if left > 0:
                self.renewed_at = time.monotonic()
                continue
            await on_expired()
            with contextlib.suppress(EtcdUnavailable):
                await self.grant_lease(ttl)

    async def keep_alive(self) -> int:
        """Renews the lease once; returns its remaining TTL (≤ 0: it is gone)."""
        _kv, lease = self._stubs()
        try:
            call = lease.LeaseKeepAlive(timeout=self.timeout)
            await call.write(rpc.LeaseKeepAliveRequest(ID=self.lease_id))
            reply = await call.read()
            await call.done_writing()
            call.cancel()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # With etcd's authentication the stream is intercepted (the token): a call whose
            # token could not be fetched fails its write with InvalidStateError, not an
            # AioRpcError (etcd down) — the same unavailability.
            raise await self._failed(exc) from None
        if reply is grpc.aio.EOF:
            raise EtcdUnavailable("lease keep-alive stream closed")
        return int(reply.TTL)

    async def revoke_lease(self) -> None:
        if not self.lease_id:
            return
        _kv, lease = self._stubs()
        try:
            await lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=self.lease_id), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            log.warning("lease revoke failed", extra={"fields": {"error": str(exc)[:200]}})
        self.lease_id = 0

    # --- shard state ------------------------------------------------------------------------

    async def read(self) -> ShardState:
        request = rpc.TxnRequest(success=[
            rpc.RequestOp(request_range=rpc.RangeRequest(key=self.leader_key)),
            rpc.RequestOp(request_range=rpc.RangeRequest(key=self.isr_key)),
            rpc.RequestOp(request_range=rpc.RangeRequest(key=self.handover_key))])
        reply = await self._txn(request)
        leader_kvs = reply.responses[0].response_range.kvs
        isr_kvs = reply.responses[1].response_range.kvs
        leader = None
        if leader_kvs:
            kv0 = leader_kvs[0]
            body = json.loads(kv0.value)
            leader = Leader(int(body["replica"]), str(body["address"]), kv0.create_revision, kv0.lease,
                            str(body.get("replication", "")))
        if isr_kvs:
            body = json.loads(isr_kvs[0].value)
            isr = InSync(tuple(sorted(int(m) for m in body["members"])), isr_kvs[0].mod_revision)
        else:
            isr = InSync((), 0)
        handover_kvs = reply.responses[2].response_range.kvs
        handover = int(json.loads(handover_kvs[0].value)["to"]) if handover_kvs else None
        return ShardState(leader, isr, handover)

    async def campaign(self, address: str, replication_address: str, isr: InSync,
                       new_members: tuple[int, ...]) -> int | None:
        """Takes the leadership if nobody holds it and the in-sync set is still ``isr``;
        writes ``new_members`` as the set. Returns the new epoch, or None when another
        replica won or the set changed."""
        compare = [rpc.Compare(key=self.leader_key, target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL,
                               version=0)]
        if isr.revision:
            compare.append(rpc.Compare(key=self.isr_key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                                       mod_revision=isr.revision))
        else:
            compare.append(rpc.Compare(key=self.isr_key, target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL,
                                       version=0))
        value = json.dumps({"replica": self.replica_id, "address": address,
                            "replication": replication_address}).encode()
        request = rpc.TxnRequest(compare=compare, success=[
            rpc.RequestOp(request_put=rpc.PutRequest(key=self.leader_key, value=value, lease=self.lease_id)),
            rpc.RequestOp(request_put=rpc.PutRequest(key=self.isr_key, value=_isr_value(new_members, 0))),
        ])
        reply = await self._txn(request)
        if not reply.succeeded:
            return None
        # Both keys were written at this revision: the leader key's create revision.
        return int(reply.header.revision)

    async def set_isr(self, epoch: int, isr: InSync, members: tuple[int, ...]) -> InSync | None:
        """Compare-and-swap of the in-sync set by the leader of ``epoch``: succeeds only if
        that leader still holds the key and nobody changed the set since ``isr``."""
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(key=self.leader_key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                            create_revision=epoch),
                rpc.Compare(key=self.isr_key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                            mod_revision=isr.revision),
            ],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=self.isr_key, value=_isr_value(members, epoch)))])
        reply = await self._txn(request)
        if not reply.succeeded:
            return None
        return InSync(tuple(sorted(members)), int(reply.header.revision))

    async def hand_over(self, epoch: int, to: int, ttl_seconds: int) -> bool:
        """Deletes this leader's key and names ``to`` as the replica to campaign, for
        ``ttl_seconds`` (then anyone in sync may campaign again)."""
        _kv, lease = self._stubs()
        try:
            grant = await lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl_seconds), timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise await self._failed(exc) from None
        request = rpc.TxnRequest(
            compare=[rpc.Compare(key=self.leader_key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                                 create_revision=epoch)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self.leader_key)),
                     rpc.RequestOp(request_put=rpc.PutRequest(
                         key=self.handover_key, value=json.dumps({"to": to}).encode(), lease=grant.ID))])
        return bool((await self._txn(request)).succeeded)

    async def resign(self, epoch: int) -> bool:
        """Deletes the leader key if it is still this leader's (a clean hand-over)."""
        request = rpc.TxnRequest(
            compare=[rpc.Compare(key=self.leader_key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL,
                                 create_revision=epoch)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self.leader_key))])
        reply = await self._txn(request)
        return bool(reply.succeeded)


def _isr_value(members: tuple[int, ...], epoch: int) -> bytes:
    return json.dumps({"members": sorted(members), "epoch": epoch}).encode()
