"""The follower's side of the replication stream: one session at a time with the leader
etcd names (docs/replication.md, "Fencing and the unacknowledged tail").

A session says hello (this replica's log end and last epoch), takes back the tail the
leader's answer says is not the leader's (``replog.follower_truncation``: Kafka's leader
epoch truncation, with undo records), then appends what the leader ships, one synced
batch per frame, and acknowledges its durable log end. A leader answering that this log
cannot continue its own (too far behind, or no undo record to take the tail back) sends
the replica to :mod:`.rebuild`. A session that ends is not retried here: the next
election round follows again.

**Backoff.** Consecutive sessions to the same leader epoch that end before appending
because the leader refuses this replica (its replication right removed, a REFUSED frame)
or answers nonsense are retried after a pause (:func:`retry_after`: doubling from
``election_poll_seconds`` up to :data:`RETRY_MAX_SECONDS`, with jitter) instead of at every
election round, each a connection and a log line on the leader. A session that starts
appending clears it, and a new leader (another epoch) is followed at once; a refusal that
says the leader does not lead that epoch yet (FAILED_PRECONDITION: a new leader still
opening its term) is not counted, nor is a leader that cannot be reached (retried at every
round: a healed partition is rejoined at once). So a fail-over is never delayed by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Awaitable, Callable

import grpc

from services.common.auth import TokenFile

from ..config import BrokerConfig
from ..store import replog
from ..store.db import Database
from ..store.replication_log import CannotTruncateError
from ..transport import Connection, Refused, connect
from .state import Leader

log = logging.getLogger(__name__)

#: The longest pause between two sessions to a leader epoch that keeps failing them.
RETRY_MAX_SECONDS = 10.0


def retry_after(failures: int, now: float, *, first: float, most: float = RETRY_MAX_SECONDS,
                jitter: float = 0.5) -> float:
    """When (on the clock of ``now``) the next session to a leader epoch may start after
    ``failures`` consecutive sessions to it failed: at once after none; else ``first``
    doubled for each failure after the first, times 0.5 + ``jitter`` (in [0, 1): the
    followers of one leader spread out), and never more than ``most``."""
    if failures <= 0:
        return now
    return now + min(first * 2.0 ** min(failures - 1, 64) * (0.5 + jitter), most)


def backs_off(error: BaseException) -> bool:
    """Whether a session that failed with ``error`` before appending counts toward the
    backoff: a refusal (the leader answered, and will answer the same: this replica's
    credentials or right, a hello it does not take) or a stream that is not the protocol —
    except a refusal saying the leader does not lead that epoch yet (FAILED_PRECONDITION: a
    new leader still opening its term, followed again at the next round, as a fail-over
    needs). Not a leader that cannot be reached (refused or cut connections, timeouts: a
    crash, a partition): retried at every round, so a follower rejoins as soon as a
    partition heals and the shard has its quorum back without waiting out a pause."""
    if isinstance(error, Refused):
        return error.code != grpc.StatusCode.FAILED_PRECONDITION
    return isinstance(error, replog.FrameError)


class Following:
    def __init__(self, config: BrokerConfig, db: Callable[[], Database],
                 rebuild: Callable[[Leader], Awaitable[None]], *, clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = random.random) -> None:
        self.config = config
        self.shard = config.broker_name
        self.replica_id = config.replica_id
        self._db = db
        self._rebuild = rebuild
        #: The bearer token a follower presents in its hello (auth on without mTLS).
        self._token = TokenFile(config.auth_token_file, config.auth_reload_seconds) if config.auth_token_file else None
        #: The leader followed now (None: no session).
        self.leader: Leader | None = None
        #: The largest commit point the leader sent in this session (0: none yet).
        self.commit = 0
        self._task: asyncio.Task[None] | None = None
        self._last_error: tuple[int, str] | None = None
        self._clock = clock
        self._jitter = jitter
        #: Sessions to the leader of epoch ``_failed_epoch`` that failed in a row (see the
        #: module's "Backoff"), and when the next one may start.
        self.failures = 0
        self._failed_epoch: int | None = None
        self._retry_at = 0.0

    @property
    def epoch(self) -> int | None:
        return self.leader.epoch if self.leader is not None else None

    def waiting(self, leader: Leader) -> bool:
        """True while sessions to ``leader`` are backed off (its epoch failed them lately)."""
        return leader.epoch == self._failed_epoch and self._clock() < self._retry_at

    async def start(self, leader: Leader) -> None:
        """Follows ``leader`` in a new session, unless sessions to it are backed off (the
        next election round asks again)."""
        if self.waiting(leader):
            return
        await self.stop()
        self.leader = leader
        self.commit = 0
        self._task = asyncio.create_task(self._session(leader), name="follow")

    async def stop(self) -> None:
        task, self._task = self._task, None
        self.leader = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _failed(self, leader: Leader) -> float:
        """A session to ``leader`` ended before appending; returns the pause before the next."""
        if leader.epoch != self._failed_epoch:
            self._failed_epoch, self.failures = leader.epoch, 0
        self.failures += 1
        now = self._clock()
        self._retry_at = retry_after(self.failures, now, first=self.config.election_poll_seconds,
                                     jitter=self._jitter())
        return self._retry_at - now

    async def _session(self, leader: Leader) -> None:
        conn: Connection | None = None
        appending = False
        try:
            if not leader.replication_address:
                raise Refused(grpc.StatusCode.UNAVAILABLE, "the leader advertises no replication address")
            conn = await connect(leader.replication_address, max(self.config.leader_lease_seconds, 1.0))
            db = self._db()
            token = self._token.token() if self._token is not None else ""
            conn.send(replog.encode_hello(self.shard, self.replica_id, leader.epoch, db.written, db.replication.last_epoch, token))
            kind, body = await conn.read()
            epoch, commit, truncate_to, _ = replog.decode_leader(kind, body)
            if kind == replog.CHECKPOINT:
                await conn.close()
                await self._rebuild(leader)
                return
            if kind != replog.START:
                raise RuntimeError(f"the leader's first answer is a {replog.KIND_NAMES[kind]}, not a start")
            # Entries of epochs the leader never knew are not its own, even below its answer.
            target = replog.follower_truncation(db.replication.epochs, db.written, truncate_to, replog.start_end_epoch(body))
            try:
                db.replication.truncate(target)
            except CannotTruncateError as exc:
                log.warning("cannot take back the log: rebuilding", extra={"fields": {"why": str(exc)}})
                await conn.close()
                await self._rebuild(leader)
                return
            if target < db.written:
                raise RuntimeError(f"log end {db.written} after truncating to {target}")
            if target < truncate_to:
                # The leader ships from its own answer on: a new session tells it where this log ends now.
                log.warning("log taken back past the leader's answer: epochs it never knew", extra={"fields": {
                    "truncate_to": target, "leader_answer": truncate_to, "epochs": db.replication.epochs}})
                return
            conn.send(replog.encode_ack(db.written))
            appending = True
            self.failures, self._failed_epoch = 0, None
            beat = asyncio.ensure_future(self._heartbeat(conn, db))
            try:
                rebuild = await self._append(conn, db, leader)
            finally:
                beat.cancel()
            if rebuild:
                await conn.close()
                await self._rebuild(leader)
        except asyncio.CancelledError:
            raise
        except (Refused, OSError, EOFError, TimeoutError, replog.FrameError) as exc:
            pause = self._failed(leader) if not appending and backs_off(exc) else 0.0
            kind_of = exc.code.name if isinstance(exc, Refused) else type(exc).__name__
            if (leader.epoch, kind_of) != self._last_error:
                # Once per leader and kind: a dead leader is retried (backing off) until etcd moves on.
                self._last_error = (leader.epoch, kind_of)
                log.info("replication session ended", extra={"fields": {
                    "leader": leader.replication_address or leader.address, "epoch": leader.epoch,
                    "code": kind_of, "error": str(exc)[:300], "retry_in_seconds": round(pause, 3)}})
        except Exception:  # the election loop starts a new session
            if not appending:
                self._failed(leader)
            log.exception("replication session failed")
        finally:
            if conn is not None:
                await conn.close()
            if self.leader is leader:
                self.leader = None  # the next election round follows again

    async def _append(self, conn: Connection, db: Database, leader: Leader) -> bool:
        """Appends what the leader ships until it sends another epoch's frame (False) or
        says this log cannot continue its own (True: rebuild)."""
        while True:
            kind, body = await conn.read()
            epoch, commit, _, entries = replog.decode_leader(kind, body)
            if epoch != leader.epoch:
                return False
            if kind == replog.ENTRIES:
                db.replication.append_entries(entries, commit)
                if db.sync:
                    db.sync_wal()
                conn.send(replog.encode_ack(db.written))
                await conn.drain()
            elif kind == replog.CHECKPOINT:
                return True
            elif kind != replog.HEARTBEAT:
                raise replog.FrameError(f"a {replog.KIND_NAMES[kind]} in the middle of a session")
            self.commit = max(self.commit, commit)
            db.replication.note_commit(commit)

    async def _heartbeat(self, conn: Connection, db: Database) -> None:
        while True:
            await asyncio.sleep(self.config.election_poll_seconds)
            conn.send(replog.encode_ack(db.written))
            await conn.drain()
