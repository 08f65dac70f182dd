"""The clients a broker sees of its groups, in memory: every consumer receiving from a
group's topic (by client id, else its address) with when it last received and whether a
receive of it waits now (a long poll), and the checkers claiming checks for a producer
group (``checks.Claims`` tells it of each claim, and of each claim held on the broker while it
waits: ``claimwaits.py``) and the producers sending its half messages.

**Live** (what an offset reset refuses to run under, Kafka's rule for a group with members):
a consumer is live in (group, topic) while a receive of it waits, or for
``consumer_session_seconds`` after its last receive there. Nothing here is persisted: after
a restart or a fail-over a consumer is live again from its next receive, which a running
consumer makes within its long-poll time.

A checker is live for a producer group likewise: while a claim of it for the group is held
here (an idle checker's long poll, up to its ``claim_wait_seconds``, which may be longer than
the session time), or for ``consumer_session_seconds`` after its last claim.

Owned by the event loop, like the rest of the domain.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Iterator

#: Clients remembered at most by default (``max_tracked_clients``; the least recently seen
#: are forgotten first, but never one waiting in a long poll).
MAX_CLIENTS = 10_000


@dataclass(slots=True)
class Receiver:
    group: str
    client_id: str
    address: str
    #: Topic → when it last received from it (broker clock, ms).
    topics: dict[str, int] = field(default_factory=dict)
    #: Receives of it waiting now, by topic.
    waiting: dict[str, int] = field(default_factory=dict)

    def last_seen_ms(self) -> int:
        return max(self.topics.values(), default=0)


@dataclass(frozen=True, slots=True)
class CheckerClaim:
    producer_group: str
    checker_id: str
    #: The free credit its producers of the group granted at the last claim.
    capacity: int
    last_seen_ms: int
    #: A claim of it for the group is held here now (``checkers_of`` sets it).
    held: bool = False


class Receivers:
    def __init__(self, session_ms: int, max_clients: int = MAX_CLIENTS) -> None:
        self.session_ms = session_ms
        self.max_clients = max_clients
        self._receivers: dict[tuple[str, str], Receiver] = {}
        #: (producer group, checker id) → its last claim.
        self._checkers: dict[tuple[str, str], CheckerClaim] = {}
        #: (producer group, checker id) → its claims held here now (``holding``).
        self._held: dict[tuple[str, str], set[object]] = {}
        #: (producer group, producer client id) → when it last sent a half message here.
        self._producers: dict[tuple[str, str], int] = {}

    def received(self, group: str, topic: str, client_id: str, address: str, now_ms: int) -> Receiver:
        """A receive of ``client_id`` (its ``address`` when it names none) from ``topic``."""
        who = client_id or address
        receiver = self._receivers.pop((group, who), None) or Receiver(group, who, address)
        receiver.address = address or receiver.address
        receiver.topics[topic] = now_ms
        self._receivers[(group, who)] = receiver  # the most recently seen last
        while len(self._receivers) > self.max_clients:
            # The least recently seen that waits in no long poll: a waiting one (the longest
            # waiting is the oldest) must not stop the forgetting, or client ids chosen by
            # one tenant would pile up without bound behind it. The waiting ones are bounded
            # by the long polls allowed.
            oldest = next((key for key, r in self._receivers.items() if not r.waiting and r is not receiver), None)
            if oldest is None:
                break
            del self._receivers[oldest]
        return receiver

    def wait_begins(self, receiver: Receiver, topic: str) -> None:
        receiver.waiting[topic] = receiver.waiting.get(topic, 0) + 1

    def wait_ends(self, receiver: Receiver, topic: str, now_ms: int) -> None:
        left = receiver.waiting.get(topic, 0) - 1
        if left > 0:
            receiver.waiting[topic] = left
        else:
            receiver.waiting.pop(topic, None)
        receiver.topics[topic] = now_ms  # it was there until now

    def live(self, group: str, topic: str, now_ms: int) -> list[Receiver]:
        """The group's live consumers of ``topic`` (see the module docstring)."""
        return [r for (g, _who), r in self._receivers.items()
                if g == group and (r.waiting.get(topic) or now_ms - r.topics.get(topic, -2**62) < self.session_ms)]

    def of_group(self, group: str, now_ms: int) -> list[Receiver]:
        """The group's consumers seen within the session time (or waiting now)."""
        return [r for (g, _who), r in self._receivers.items()
                if g == group and (r.waiting or now_ms - r.last_seen_ms() < self.session_ms)]

    def known(self, group: str) -> int:
        """How many clients of the consumer group are remembered (live or not)."""
        return sum(1 for g, _who in self._receivers if g == group)

    def forget_group(self, group: str) -> int:
        """Forgets every client of the consumer group (its deletion); returns how many. A
        receive of it still waiting holds its own record and goes on (a forced deletion)."""
        keys = [key for key in self._receivers if key[0] == group]
        for key in keys:
            del self._receivers[key]
        return len(keys)

    def claimed(self, checker_id: str, groups: dict[str, int], now_ms: int) -> None:
        """A checker's claim for ``groups`` (group → its producers' free credit)."""
        for group, capacity in groups.items():
            self._checkers.pop((group, checker_id), None)
            self._checkers[(group, checker_id)] = CheckerClaim(group, checker_id, capacity, now_ms)  # newest last
        while len(self._checkers) > self.max_clients:
            # The least recently seen whose claim is not held now (the held ones are
            # bounded by the long polls allowed, as a consumer's waiting receives).
            oldest = next((key for key in self._checkers if key not in self._held), None)
            if oldest is None:
                break
            del self._checkers[oldest]

    @contextlib.contextmanager
    def holding(self, checker_id: str, groups: dict[str, int], now_ms: int) -> Iterator[None]:
        """A claim of ``checker_id`` for ``groups`` held here (``claimwaits.py``): its
        checker is live for them while it waits, however long (producers connected to it
        with nothing due), as a consumer is while its receive waits."""
        self.claimed(checker_id, groups, now_ms)
        token = object()
        keys = [(group, checker_id) for group in groups]
        for key in keys:
            self._held.setdefault(key, set()).add(token)
        try:
            yield
        finally:
            for key in keys:
                tokens = self._held.get(key)
                if tokens is not None:
                    tokens.discard(token)
                    if not tokens:
                        del self._held[key]

    def produced(self, group: str, client_id: str, now_ms: int) -> None:
        """A half message of the producer group from ``client_id`` (what makes its producers
        live for a deletion of the group, with its checkers' claims)."""
        key = (group, client_id)
        self._producers.pop(key, None)
        self._producers[key] = now_ms  # the most recently seen last
        while len(self._producers) > self.max_clients:
            del self._producers[next(iter(self._producers))]

    def producers_of(self, group: str, now_ms: int) -> list[tuple[str, int]]:
        """(client id, last half message) of the group's producers seen within the session time."""
        return [(who, at) for (g, who), at in self._producers.items() if g == group and now_ms - at < self.session_ms]

    def forget_producers(self, group: str) -> None:
        """Forgets the producer group's producers and checkers (its deletion). A claim of it
        still held goes on, and its checker is seen again when it ends (a forced deletion
        of a group whose producers are still connected: they make it anew)."""
        for table in (self._producers, self._checkers, self._held):
            for key in [key for key in table if key[0] == group]:
                del table[key]

    def checkers_of(self, group: str, now_ms: int) -> list[CheckerClaim]:
        """The checkers that claimed the producer group's checks within the session time,
        or whose claim for it is held now (``held``)."""
        return [replace(c, held=True) if key in self._held else c for key, c in self._checkers.items()
                if key[0] == group and (key in self._held or now_ms - c.last_seen_ms < self.session_ms)]
