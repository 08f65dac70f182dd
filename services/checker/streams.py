"""The producers' check streams: each one (``ProducerStream``: its groups, the credit it
granted, the responses waiting to be written) and which of them serve each producer group
(``Membership``).

``Membership`` is what the dispatcher routes by and the claims follow: a group's streams in
subscription order and where its round robin starts next, the groups' credit sums
(``credit.GroupCredit``) as streams join and leave them and take and give back credit, and a
version that grows whenever a group or a capacity changes (the claim sessions then send their
group list again: ``brokers``). ``on_groups_changed`` is called when a group gains a stream or
enough free credit for a claim.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Callable, Iterable, Protocol

from txmq.errors import TxmqError
from txmq.v1 import checker_pb2

from services.common.errors import entry_status

from .credit import GroupCredit

#: Responses queued for one stream beyond which the checker reads no more of its requests
#: until the producer reads (each refused request queues one: a producer sending a flood
#: and reading nothing grew the checker's memory without bound).
MAX_QUEUED_REPLIES = 1024

Response = checker_pb2.CheckTransactionStateResponse


class ProducerStream:
    """One subscribed CheckTransactionState stream: its producer instance, its groups, the
    checks it can still be sent (``credit``) and the responses waiting to be written.
    ``capacity`` is the credit it announced (at most ``max_credit``; the default for a
    stream without flow control, ``legacy``): credit granted later only refills it, so a
    stream never holds more checks not yet answered than its capacity."""

    def __init__(self, stream_id: int, client_id: str, groups: tuple[str, ...], credit: int,
                 max_credit: int, legacy: bool = False) -> None:
        self.id = stream_id
        self.client_id = client_id
        #: The groups it subscribed to, and those it serves now (a revoke takes some away,
        #: a right granted again brings them back: ``Dispatcher.revoke``, ``readmit``).
        self.subscribed = groups
        self.groups = groups
        self.max_credit = max_credit
        self.capacity = min(credit, max_credit)
        self.credit = self.capacity
        self.legacy = legacy
        self.closed = False
        #: Sent CheckDrain: no more checks, answers still welcome (see Dispatcher.drain).
        self.draining = False
        #: Why the checker ended the stream (a revoked right: see Dispatcher.revoke), if it did.
        self.refusal: TxmqError | None = None
        #: The groups revoked from it, and what it was told (its answers for them are refused so).
        self.lost: dict[str, TxmqError] = {}
        #: Check ids sent on this stream and not finished.
        self.checks: set[str] = set()
        self._outbox: collections.deque[Response] = collections.deque()
        self._waiter: Callable[[], None] | None = None
        #: Set while fewer than MAX_QUEUED_REPLIES responses wait to be written (see ``pop``).
        self.room = asyncio.Event()
        self.room.set()

    def __repr__(self) -> str:
        return f"<ProducerStream {self.id} {self.client_id!r} {list(self.groups)} credit={self.credit}>"

    @property
    def has_room(self) -> bool:
        return not (self.closed or self.draining) and self.credit > 0

    def offer_check(self, response: Response) -> bool:
        """Sends a check against one unit of credit, unless closed or out of credit."""
        if not self.has_room:
            return False
        self.credit -= 1
        self._push(response)
        return True

    def push(self, response: Response) -> None:
        """Queues a reply (not bounded: one per request the producer sent)."""
        if not self.closed:
            self._push(response)

    def _push(self, response: Response) -> None:
        self._outbox.append(response)
        if len(self._outbox) >= MAX_QUEUED_REPLIES:
            self.room.clear()  # the stream's reader waits (the producer does not read)
        if self._waiter is not None:
            self._waiter()

    def pop(self) -> Response | None:
        """The next response to write, or None when nothing is queued."""
        if not self._outbox:
            return None
        response = self._outbox.popleft()
        if len(self._outbox) < MAX_QUEUED_REPLIES // 2:
            self.room.set()
        return response

    def withdraw(self, check_ids: set[str], reply: Response) -> None:
        """Takes these checks out of the responses not yet written, and queues ``reply``."""
        kept = [r for r in self._outbox if not (r.HasField("check") and r.check.check_id in check_ids)]
        self._outbox = collections.deque(kept)
        if len(kept) < MAX_QUEUED_REPLIES // 2:
            self.room.set()
        self.push(reply)

    def lose(self, groups: set[str], refusal: TxmqError) -> None:
        """A revoke took ``groups`` from it: it serves them no more, and its answers naming
        them are refused with ``refusal``."""
        self.groups = tuple(g for g in self.groups if g not in groups)
        self.lost.update(dict.fromkeys(groups, refusal))

    def regain(self, groups: tuple[str, ...]) -> None:
        """A right granted again brings back ``groups`` (lost by a revoke), in the order it
        subscribed to them."""
        for group in groups:
            del self.lost[group]
        self.groups = tuple(g for g in self.subscribed if g in groups or g in self.groups)

    def set_waiter(self, wake: Callable[[], None] | None) -> None:
        self._waiter = wake

    def close(self) -> None:
        self.closed = True
        self._outbox.clear()
        self.room.set()
        if self._waiter is not None:
            self._waiter()


class MembershipMetrics(Protocol):
    def producers(self, group: str, count: int) -> None: ...
    def group_gone(self, group: str) -> None: ...


class Membership:
    def __init__(self, metrics: MembershipMetrics, credit: GroupCredit) -> None:
        self.metrics = metrics
        #: Per group: the credit its streams announced and what of it is free (the claims').
        self.credit = credit
        #: group → stream id → stream, in subscription order.
        self.by_group: dict[str, dict[int, ProducerStream]] = {}
        self._rr: dict[str, int] = {}
        #: Grows whenever a group or a capacity changes (the claim sessions resend their list).
        self.version = 1
        #: Called when a group gains its first stream or enough free credit for a claim.
        self.on_groups_changed: list[Callable[[], None]] = []

    def join(self, stream: ProducerStream, groups: Iterable[str]) -> None:
        """The stream serves ``groups``: checks routed to it, its capacity and free credit in
        the groups' sums."""
        for group in groups:
            members = self.by_group.setdefault(group, {})
            members[stream.id] = stream
            self.metrics.producers(group, len(members))
            self.credit.join(group, stream.capacity, stream.credit)
        self.version += 1

    def leave(self, stream: ProducerStream, groups: Iterable[str] | None = None) -> None:
        """The stream serves its groups (or ``groups`` of them) no more: no routing to it,
        its capacity and free credit leave the groups' sums."""
        for group in stream.groups if groups is None else groups:
            members = self.by_group.get(group)
            if members is not None:
                members.pop(stream.id, None)
                self.metrics.producers(group, len(members))
                self.credit.leave(group, stream.capacity, stream.credit, last=not members)
                if not members:
                    del self.by_group[group]
                    self._rr.pop(group, None)
                    self.metrics.group_gone(group)
        if groups is None:
            stream.credit = 0
        self.version += 1

    def route(self, group: str) -> tuple[list[ProducerStream], int]:
        """The group's streams, and where the round robin over them starts for its next check."""
        start = self._rr.get(group, 0)
        self._rr[group] = start + 1
        return list(self.by_group.get(group, {}).values()), start

    def took(self, stream: ProducerStream) -> None:
        """The stream took a check: one unit less of free credit in each of its groups."""
        for group in stream.groups:
            self.credit.move(group, -1)

    def give_back(self, stream: ProducerStream, checks: int) -> None:
        """Up to ``checks`` units of the stream's credit back (never beyond its capacity)."""
        if stream.closed or stream.draining:
            return
        checks = min(checks, stream.capacity - stream.credit)
        if checks <= 0:
            return
        stream.credit += checks
        # Every group's credit moves (no short-circuit); a claim is worth it for one of them.
        if any([self.credit.move(group, checks) for group in stream.groups]):
            self.wake()

    def wake(self) -> None:
        for wake in self.on_groups_changed:
            wake()


def error_response(error: TxmqError, check_id: str = "") -> Response:
    """A refused request on the stream; names the check it was about."""
    status = entry_status(error)
    if check_id:
        status.details["check_id"] = json.dumps(check_id)
    return checker_pb2.CheckTransactionStateResponse(error=status)
