"""The per-principal quotas' pure decisions (``services.common.auth.quota``): which names a
principal's rights cover, counted up to the limit; who is not counted; and the broker's
sorted index of its consumer groups (``consumers.GroupNames``) and its cached counts
(``quotas.Quotas``), table-driven."""

from __future__ import annotations

import random

import pytest

from services.broker.config import BrokerConfig
from services.broker.consumers import GroupNames
from services.broker.model import KIND_HALF
from services.broker.quotas import Quotas
from services.broker.store.codec import LogRecord
from services.broker.store.db import OpWrites
from services.common.auth.acl import ADMIN_WRITE, CHECK, CONSUMER_GROUP, PUBLISH, SUBSCRIBE, TOPIC, allows
from services.common.auth.quota import Subject, count_covered, refuse_beyond, unlimited
from services.common.auth.store import parse
from txmq.errors import QuotaExceededError, ResourceExhaustedError

RULES = parse([("credentials.yaml", {
    "principals": {name: {} for name in ("alice", "bob", "ops", "wide", "staged", "plain", "exact")},
    "acl": [
        {"principal": "alice", "resource": "consumer_group:a.*", "actions": ["subscribe"]},
        {"principal": "alice", "resource": "consumer_group:a.admin.*", "actions": ["admin-write"]},
        {"principal": "alice", "resource": "consumer_group:shared", "actions": ["subscribe"]},
        {"principal": "alice", "resource": "topic:a.*", "actions": ["publish", "subscribe"]},
        {"principal": "alice", "resource": "producer_group:a.*", "actions": ["check"]},
        {"principal": "bob", "resource": "consumer_group:b.*", "actions": ["subscribe"]},
        {"principal": "bob", "resource": "consumer_group:a.*", "actions": ["admin-read"]},
        {"principal": "bob", "resource": "producer_group:b.*", "actions": ["check"]},
        {"principal": "ops", "resource": "cluster", "actions": ["admin-write"]},
        {"principal": "wide", "resource": "consumer_group:*", "actions": ["subscribe"]},
        {"principal": "staged", "namespace": "staging", "resource": "consumer_group:*", "actions": ["subscribe"]},
        {"principal": "staged", "namespace": "staging", "resource": "cluster", "actions": ["publish"]},
        {"principal": "plain", "namespace": "", "resource": "consumer_group:p*", "actions": ["subscribe"]},
        {"principal": "exact", "resource": "consumer_group:e1", "actions": ["subscribe"]},
        {"principal": "exact", "resource": "consumer_group:e2", "actions": ["subscribe"]},
    ]})]).rules
CONSUMERS = (SUBSCRIBE, ADMIN_WRITE)
GROUPS = sorted((g,) for g in [
    "a.1", "a.2", "a.admin.x", "a", "ab.1", "b.1", "b.2", "shared", "staging%x", "staging%y", "prod%x", "p1", "p2",
    "px%p3", "e1", "e10", "e2"])


def who(name: str) -> Subject:
    return Subject(name, RULES)


@pytest.mark.parametrize(("principal", "actions", "expected"), [
    # Her prefix (not "a" itself, nor "ab.1"), her admin-write prefix inside it, her exact name.
    ("alice", CONSUMERS, {"a.1", "a.2", "a.admin.x", "shared"}),
    ("alice", (ADMIN_WRITE,), {"a.admin.x"}),
    # Rights that create none (admin-read) count nothing.
    ("bob", CONSUMERS, {"b.1", "b.2"}),
    # A namespaced rule covers its namespace's names alone; "" the names in none.
    ("staged", CONSUMERS, {"staging%x", "staging%y"}),
    ("plain", CONSUMERS, {"p1", "p2"}),
    # Exact names: e1 and e2, never e10.
    ("exact", CONSUMERS, {"e1", "e2"}),
])
def test_a_principal_counts_the_names_its_creating_rights_cover(principal, actions, expected):
    assert count_covered(who(principal), actions, CONSUMER_GROUP, GROUPS, 1000) == len(expected)
    # The same as asking the ACL name by name.
    assert {g for (g,) in GROUPS if any(allows(RULES, principal, a, CONSUMER_GROUP, g) for a in actions)} == expected


def test_counting_stops_at_the_limit():
    assert count_covered(who("alice"), CONSUMERS, CONSUMER_GROUP, GROUPS, 2) == 2


def test_pairs_count_by_their_group():
    pairs = sorted([("a.1", "t1"), ("a.1", "t2"), ("a.2", "t1"), ("ab.1", "t1"), ("b.1", "t1"), ("e1", "t"),
                    ("e10", "t")])
    assert count_covered(who("alice"), CONSUMERS, CONSUMER_GROUP, pairs, 1000) == 3
    assert count_covered(who("exact"), CONSUMERS, CONSUMER_GROUP, pairs, 1000) == 1


def test_system_names_are_never_counted():
    topics = sorted([("%DLQ%staging%x",), ("%DISCARD%a.1",), ("staging%t",)])
    assert count_covered(who("staged"), (PUBLISH,), TOPIC, topics, 1000) == 1


@pytest.mark.parametrize(("principal", "kind", "actions", "free"), [
    ("ops", CONSUMER_GROUP, CONSUMERS, True),     # admin-write on the cluster
    ("ops", CONSUMER_GROUP, (SUBSCRIBE,), False),  # ... but subscribe is not among its rights
    ("wide", CONSUMER_GROUP, CONSUMERS, True),    # consumer_group:*
    ("wide", TOPIC, (PUBLISH,), False),
    ("staged", TOPIC, (PUBLISH,), False),         # cluster, but in a namespace only
    ("alice", CONSUMER_GROUP, CONSUMERS, False),
])
def test_who_is_not_counted(principal, kind, actions, free):
    assert unlimited(who(principal), actions, kind) is free


def test_the_refusal_names_the_setting_and_the_limit():
    refuse_beyond(None, CONSUMERS, CONSUMER_GROUP, GROUPS, 1, "max_consumer_groups_per_principal", "consumer groups",
                  "consumer group 'a.3'")  # not counted: nothing refused
    refuse_beyond(who("wide"), CONSUMERS, CONSUMER_GROUP, GROUPS, 1, "max_consumer_groups_per_principal",
                  "consumer groups", "consumer group 'a.3'")
    refuse_beyond(who("alice"), CONSUMERS, CONSUMER_GROUP, GROUPS, 5, "max_consumer_groups_per_principal",
                  "consumer groups", "consumer group 'a.3'")  # 4 of 5
    with pytest.raises(QuotaExceededError) as caught:
        refuse_beyond(who("alice"), CONSUMERS, CONSUMER_GROUP, GROUPS, 4, "max_consumer_groups_per_principal",
                      "consumer groups", "consumer group 'a.3'")
    error = caught.value
    assert isinstance(error, ResourceExhaustedError) and not error.retryable
    assert (error.setting, error.limit, error.principal) == ("max_consumer_groups_per_principal", 4, "alice")
    assert "max_consumer_groups_per_principal=4" in error.message and "'a.3'" in error.message
    # Another principal's names are never in it.
    assert "b.1" not in error.message


def test_producer_groups_count_by_check():
    groups = sorted([("a.p",), ("a.q",), ("b.p",)])
    assert count_covered(who("alice"), (CHECK,), "producer_group", groups, 10) == 2


def test_the_broker_keeps_its_group_names_sorted_as_cursors_come_and_go():
    names = GroupNames()
    rng = random.Random(7)
    names.rebuild([("g1", "t", 0), ("g1", "t", 1), ("g0", "u", 0)])
    live: dict[tuple[str, str], int] = {("g1", "t"): 2, ("g0", "u"): 1}
    for _ in range(2000):
        pair = (f"g{rng.randrange(6)}", f"t{rng.randrange(3)}")
        version = names.version
        if rng.random() < 0.6 or not live.get(pair):
            was_new = pair not in live
            names.added(*pair)
            live[pair] = live.get(pair, 0) + 1
            assert (names.version != version) is was_new
        else:
            names.removed(*pair)
            live[pair] -= 1
            if not live[pair]:
                del live[pair]
        assert names.pairs == sorted(live)
        assert names.groups == sorted({(g,) for g, _t in live})
        assert all(names.has_pair(*p) for p in live) and all(names.has_group(g) for g, _t in live)


def test_the_brokers_cached_counts_refuse_exactly_where_a_fresh_count_would():
    """The broker caches each principal's counts and moves them on with the names it makes
    itself; other principals' names invalidate them. Its refusals must be those of counting
    afresh every time."""
    config = BrokerConfig(max_consumer_groups_per_principal=4, max_subscriptions_per_principal=6,
                          max_producer_groups_per_principal=3)
    names, counters = GroupNames(), {}
    removed = [0]
    quotas = Quotas(config, names, counters, lambda: removed[0])
    rng = random.Random(11)
    subjects = [who("alice"), who("bob"), None]
    for _ in range(3000):
        subject = rng.choice(subjects)
        prefix = {"alice": "a.", "bob": "b."}.get(subject.principal if subject else "", rng.choice(["a.", "b."]))
        if rng.random() < 0.7:
            group, topic = f"{prefix}{rng.randrange(8)}", f"t{rng.randrange(3)}"
            fresh_groups = count_covered(subject, CONSUMERS, CONSUMER_GROUP, names.groups, 4) if subject else 0
            fresh_pairs = count_covered(subject, CONSUMERS, CONSUMER_GROUP, names.pairs, 6) if subject else 0
            expect_refused = subject is not None and not names.has_pair(group, topic) and (
                (not names.has_group(group) and fresh_groups >= 4) or fresh_pairs >= 6)
            op = quotas.subscribing(subject, group, topic, lambda w, g=group, t=topic: names.added(g, t))
            try:
                op(OpWrites())
                refused = False
            except QuotaExceededError:
                refused = True
            assert refused == expect_refused
            if not refused and rng.random() < 0.2:
                names.removed(group, topic)  # a topic deleted
        else:
            group = f"{prefix}p{rng.randrange(6)}"
            fresh = count_covered(subject, (CHECK,), "producer_group", sorted((g,) for g in counters), 3) \
                if subject else 0
            expect_refused = subject is not None and group not in counters and fresh >= 3
            record = LogRecord(kind=KIND_HALF, topic="t", body=b"", message_id="m", queue_id=0, stored_ms=0,
                               producer_group=group)
            op = quotas.producing(subject, record, lambda w, g=group: counters.setdefault(g, [0, 0]))
            try:
                op(OpWrites())
                refused = False
            except QuotaExceededError:
                refused = True
            assert refused == expect_refused
            if not refused and rng.random() < 0.1:
                del counters[group]  # the producer group deleted (producerdelete.py)
                removed[0] += 1
