"""Between the asyncio server and the store: operations run on the event loop, answers
wait for durability.

:meth:`StoreBridge.apply` runs an operation at once on the loop thread (``Database.apply``:
one unsynced WriteBatch) and returns its result with a ticket; :meth:`when_durable` runs a
callback once that ticket is durable. The rule every RPC follows: nothing is answered
before everything it wrote (unless the operation said ``sync=False``) **and every
sync-requiring write it read** is durable, so no client ever acts on a state a machine
crash could take back: a consumer never receives a commit that is not synced, a duplicate
send never reports a transaction whose half message is not. Writes made with
``sync=False`` (receives, acks) hold nobody: losing one only means a redelivery.

With ``flush=sync`` the bridge syncs RocksDB's WAL itself, on the loop. The first answer
that starts waiting schedules a sync with ``call_soon``, so every request applied in the
same loop iteration shares it, and the requests that arrive while it runs share the next
one (group commit). The loop serves nothing else for the ~0.1–0.5 ms of an fdatasync
(RocksDB releases the GIL meanwhile, so /metrics is still served); every producer's answer
waits for it anyway, and syncing in place costs none of the cross-process wake-ups a sync
helper did (measured in ``bench.transactions``: +10–37 % txn/s for 2 to 16 producers,
README "Performance"). A failed sync stops the broker: writes were applied that can no
longer be made durable, and a restart recovers from what is on disk.
With ``flush=async`` everything counts as durable once written.

On a replicated shard "durable" also means *on every in-sync replica*: the replication
leader (``replication.ReplicaNode``) sets :attr:`StoreBridge.commit_gate` and calls
:meth:`StoreBridge.release` as followers report their durable positions, and an answer
waits for the smaller of the local sync and that commit point. Waiters are kept in ticket
order (tickets only grow), so a release runs a prefix of them. If the replica loses its
leadership, :meth:`fail_all` answers every waiter with the error (outcome unknown to the
client, which retries with the same ids on the new leader).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from typing import Any, Callable, Iterator

from .store.db import GROUP_TICKET, Database, Op, WriteGroup

log = logging.getLogger(__name__)


class StoreBridge:
    def __init__(self, db: Database, loop: asyncio.AbstractEventLoop,
                 on_fatal: Callable[[BaseException], None],
                 on_sync: Callable[[float, int], None] | None = None) -> None:
        self.db = db
        self.loop = loop
        self._on_fatal = on_fatal
        # (seconds the sync took, writes it made durable) for every WAL sync.
        self._on_sync = on_sync
        self._durable = db.written  # what start-up wrote went through Database.call (synced)
        #: (ticket, on durable, on failure) in ticket order.
        self._waiting: collections.deque[tuple[int, Callable[[], None], Callable[[BaseException], None] | None]] = \
            collections.deque()
        #: Replicated shards: the commit point (entries on every in-sync replica); None
        #: when the shard has one replica (local durability is enough).
        self.commit_gate: Callable[[], int] | None = None
        #: Replicated shards: raises (NotEnoughReplicasError) when a write that must be
        #: durable cannot be acknowledged now; called before such a write is applied.
        self.write_guard: Callable[[], None] | None = None
        #: Replicated shards: raises (NotLeaderError) while the leadership is being handed
        #: over; called before *every* write, also those that need no sync (receives, acks),
        #: so the replica taking over can hold the whole log (and NotEnoughReplicasError
        #: while the commit point cannot reach what such a write would wait for).
        self.handover_guard: Callable[[], None] | None = None
        #: Replicated shards: while set (a leader whose commit point is stalled, with its
        #: queues' reads capped at that point: ``Queues.readable_end``), the answer of a write
        #: that needs no sync (a receive, an ack) waits only for this commit point, not for
        #: the uncommitted entries before it, which its reads no longer show.
        self.unsynced_ceiling: Callable[[], int] | None = None
        self._failed: BaseException | None = None
        #: Called with the new durable position after every local sync (the replication
        #: leader recomputes its commit point).
        self.sync_listeners: list[Callable[[int], None]] = []
        self._sync_scheduled = False
        #: WAL syncs done (group commits).
        self.syncs = 0
        self._group_hooks: list[Callable[[], None]] | None = None
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    # --- operations -----------------------------------------------------------------------

    def apply(self, op: Op, *, sync: bool = True) -> tuple[Any, int]:
        """Runs ``op`` now; returns its result and ticket (raises what it refused with).
        Its durable-hooks are queued behind the ticket. Inside :meth:`grouped` the ticket
        is ``GROUP_TICKET``: the group's comes when it ends."""
        self._admit(sync)
        return self._apply(op, sync)

    def _admit(self, sync: bool) -> None:
        """Raises what refuses a write before anything of it is applied."""
        if self._failed is not None:
            raise self._failed
        if self.handover_guard is not None:
            self.handover_guard()
        if sync and self.write_guard is not None:
            self.write_guard()

    def _apply(self, op: Op, sync: bool) -> tuple[Any, int]:
        applied = self.db.apply(op, sync=sync)
        ticket = applied.ticket
        if applied.ticket == GROUP_TICKET:
            assert self._group_hooks is not None
            self._group_hooks.extend(applied.after)
        else:
            if not sync and self.unsynced_ceiling is not None:
                ticket = min(ticket, self.unsynced_ceiling())
            for fn in applied.after:
                self.when_durable(ticket, fn)
        return applied.result, ticket

    @contextlib.contextmanager
    def grouped(self) -> Iterator[WriteGroup]:
        """:meth:`apply` calls inside write one batch (``Database.grouped``); on exit
        ``group.ticket`` covers all of them, and their durable-hooks wait for it."""
        if self._group_hooks is not None:
            raise RuntimeError("write groups do not nest")
        hooks: list[Callable[[], None]] = []
        self._group_hooks = hooks
        group: WriteGroup | None = None
        try:
            with self.db.grouped() as group:
                yield group
        finally:
            self._group_hooks = None
            if group is not None:
                # Written even if the block raised: the hooks of what it applied wait for it.
                for fn in hooks:
                    self.when_durable(group.ticket, fn)

    def run(self, op: Op, *, sync: bool = True) -> asyncio.Future[Any]:
        """``apply`` as a future resolved once the result may be told; a refusal is raised
        through it, once what the refusal was based on is durable (a guard's refusal, which
        read no state, at once)."""
        if self._group_hooks is not None:
            raise RuntimeError("run() inside a write group: its ticket is not known yet")
        fut: asyncio.Future[Any] = self.loop.create_future()
        try:
            self._admit(sync)
        except Exception as exc:  # noqa: BLE001 - the caller gets it through the future
            fut.set_exception(exc)  # at once: a refusal up front read nothing of the store
            return fut
        try:
            result, ticket = self._apply(op, sync)
        except Exception as exc:  # noqa: BLE001 - the caller gets it through the future
            self.when_durable(self.db.read_ticket, functools.partial(_fail, fut, exc), _failer(fut))
            return fut
        self.when_durable(ticket, functools.partial(_resolve, fut, result), _failer(fut))
        return fut

    def settled(self) -> asyncio.Future[None]:
        """Resolves once everything a read of the current state depends on is durable: a
        read-only RPC awaits it after reading, before answering."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self.when_durable(self.db.read_ticket, functools.partial(_resolve, fut, None), _failer(fut))
        return fut

    # --- durability -----------------------------------------------------------------------

    @property
    def durable(self) -> int:
        """Writes up to here are on this replica's disk."""
        return self._durable if self.db.sync else self.db.written

    def _released(self) -> int:
        durable = self.durable
        gate = self.commit_gate
        return durable if gate is None else min(durable, gate())

    def when_durable(self, ticket: int, fn: Callable[[], None],
                     on_fail: Callable[[BaseException], None] | None = None) -> None:
        """Runs ``fn`` (on the loop) once write ``ticket`` is durable (and, replicated, on
        every in-sync replica): now if it is. ``on_fail`` runs instead if the replica
        loses its leadership first (without it the waiter is dropped)."""
        if self._failed is not None:
            if on_fail is not None:
                on_fail(self._failed)
            return
        if ticket <= self._released():
            fn()
            return
        self._waiting.append((ticket, fn, on_fail))
        if ticket > self.durable and not self._sync_scheduled:
            # Later in this loop iteration more requests may be applied: one sync for all.
            self._sync_scheduled = True
            self.loop.call_soon(self._sync)

    @property
    def waiting(self) -> int:
        """Answers waiting for durability (or for the replicas)."""
        return len(self._waiting)

    def release(self) -> None:
        """Runs the waiters whose tickets are now durable (and committed)."""
        upto = self._released()
        waiting = self._waiting
        while waiting and waiting[0][0] <= upto:
            _ticket, fn, _fail = waiting.popleft()
            try:
                fn()
            except Exception:  # one hook must not hold up the others
                log.exception("durable hook failed")

    def fail_waiting(self, error: BaseException, above: int) -> None:
        """Fails every waiting answer whose ticket is above ``above`` with ``error`` (the
        replication leader: its commit point cannot reach them now). Unlike
        :meth:`fail_all` the bridge goes on; hooks with no failure path keep waiting."""
        def failing(waiter: tuple[int, Callable[[], None], Callable[[BaseException], None] | None]) -> bool:
            return waiter[0] > above and waiter[2] is not None
        failed = [waiter for waiter in self._waiting if failing(waiter)]
        if not failed:
            return
        self._waiting = collections.deque(waiter for waiter in self._waiting if not failing(waiter))
        for _ticket, _fn, fail in failed:
            try:
                if fail is not None:
                    fail(error)
            except Exception:
                log.exception("failure hook failed")

    def fail_all(self, error: BaseException) -> None:
        """The replica lost its leadership: every waiter gets ``error``, and so does every
        later request (this bridge is done)."""
        self._failed = error
        waiting, self._waiting = self._waiting, collections.deque()
        for _ticket, _fn, fail in waiting:
            if fail is not None:
                try:
                    fail(error)
                except Exception:
                    log.exception("failure hook failed")

    def _sync(self) -> None:
        """Makes every write so far durable (one fdatasync of the WAL) and runs what waited
        for it. Every waiting ticket is at most ``db.written``, so all of them run."""
        self._sync_scheduled = False
        if not self._waiting or not self.db.sync:
            return
        target = self.db.written
        if target <= self._durable:
            return
        started = time.perf_counter()
        try:
            self.db.sync_wal()
        except Exception as exc:  # the process stops
            # Writes were applied that can no longer be made durable: stop, and let the
            # restart recover from what is on disk (nothing acknowledged depends on them).
            log.critical("WAL sync failed", exc_info=exc)
            self._on_fatal(exc)
            return
        self.syncs += 1
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - started, target - self._durable)
        self._durable = target
        for fn in self.sync_listeners:
            fn(target)
        self.release()

    # --- long polling ---------------------------------------------------------------------

    def note_visible(self, topic: str) -> None:
        """``topic`` got messages (or an earlier redelivery): wakes its long polls."""
        self._versions[topic] = self._versions.get(topic, 0) + 1
        for waiter in self._waiters.pop(topic, ()):
            if not waiter.done():
                waiter.set_result(None)

    def version(self, topic: str) -> int:
        return self._versions.get(topic, 0)

    async def wait_visible(self, topic: str, since_version: int, timeout: float) -> None:
        """Returns when ``topic`` changed after ``since_version`` or ``timeout`` passed.
        A cancellation is never lost (``asyncio.timeout``, not 3.11's ``wait_for``, which
        returned instead when the wake-up came in the same pass: a long poll the server's
        stop had cancelled then polled on behind the stop, delivering messages to a caller
        that was gone, invisible to everyone until their invisible duration passed)."""
        if self._versions.get(topic, 0) != since_version or timeout <= 0:
            return
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._waiters.setdefault(topic, set()).add(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(topic)
            if waiters is not None:
                waiters.discard(waiter)


def _resolve(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _failer(fut: asyncio.Future[Any]) -> Callable[[BaseException], None]:
    return functools.partial(_fail, fut)
