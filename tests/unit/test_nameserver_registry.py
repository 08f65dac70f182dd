"""The name server's registry: expiry on a fake clock, route assembly, queue spreading and
the creation decisions (pure, no gRPC)."""

from __future__ import annotations

import pytest

from txmq.errors import (BrokerNotFoundError, InvalidFieldError, InvalidNameError, NoBrokerError,
                          TopicExistsError)
from services.nameserver.registry import (QueueRoute, Registry, registering, resolve_queue_count,
                                          should_auto_create, spread_queues, validate_address)


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> Registry:
    return Registry(broker_expiry_seconds=30.0, checker_expiry_seconds=10.0, clock=clock)


def names(records) -> list[str]:
    return [r.name for r in records]


# --- expiry -----------------------------------------------------------------------------

def test_broker_expires_after_silence_and_heartbeat_keeps_it(registry: Registry, clock: FakeClock) -> None:
    registry.register_broker("b", "10.0.0.2:10911", [("orders", 2)])
    registry.register_broker("a", "10.0.0.1:10911", [("orders", 1)])
    clock.advance(20)
    registry.register_broker("a", "10.0.0.1:10911", [("orders", 1)])  # a's heartbeat
    clock.advance(9.9)
    assert names(registry.live_brokers()) == ["a", "b"]
    assert registry.live_broker_count() == 2
    clock.advance(0.1)  # b silent for 30 s, a for 10 s
    assert registry.live_broker_count() == 1
    assert names(registry.live_brokers()) == ["a"]
    assert [q.broker_name for q in registry.route("orders")] == ["a"]
    with pytest.raises(BrokerNotFoundError):
        registry.live_broker("b")
    # An expired broker that registers again is back.
    registry.register_broker("b", "10.0.0.2:10911", [("orders", 2)])
    assert names(registry.live_brokers()) == ["a", "b"]


def test_checker_expiry_and_unregister(registry: Registry, clock: FakeClock) -> None:
    registry.register_checker("c1", "10.0.1.1:10921")
    registry.register_checker("c0", "10.0.1.0:10921")
    assert names(registry.live_checkers()) == ["c0", "c1"]
    assert registry.unregister_checker("c0") is True
    assert registry.unregister_checker("c0") is False  # idempotent
    assert names(registry.live_checkers()) == ["c1"]
    clock.advance(10)
    assert registry.live_checker_count() == 0
    assert registry.live_checkers() == []


def test_unregister_broker_removes_it_at_once(registry: Registry) -> None:
    registry.register_broker("a", "h:1", [("t", 4)])
    assert registry.unregister_broker("a") is True
    assert registry.unregister_broker("a") is False
    assert registry.route("t") == []
    assert registry.live_brokers() == []


def test_last_heartbeat_is_registry_clock(registry: Registry, clock: FakeClock) -> None:
    registry.register_broker("a", "h:1")
    clock.advance(3)
    registry.register_broker("a", "h:1")
    assert registry.live_broker("a").last_heartbeat == clock.now


# --- routes -----------------------------------------------------------------------------

def test_route_is_ordered_by_broker_name_then_queue_id(registry: Registry) -> None:
    registry.register_broker("broker-2", "h2:1", [("orders", 2), ("audit", 1)])
    registry.register_broker("broker-0", "h0:1", [("orders", 3)])
    registry.register_broker("broker-1", "h1:1", [("audit", 5)])
    assert registry.route("orders") == [
        QueueRoute("broker-0", "h0:1", 0), QueueRoute("broker-0", "h0:1", 1), QueueRoute("broker-0", "h0:1", 2),
        QueueRoute("broker-2", "h2:1", 0), QueueRoute("broker-2", "h2:1", 1)]
    assert registry.route("missing") == []


def test_registration_replaces_the_topic_list(registry: Registry) -> None:
    registry.register_broker("a", "h:1", [("t", 2), ("u", 1)])
    registry.register_broker("a", "h:1", [("t", 3)])
    assert len(registry.route("t")) == 3
    assert registry.route("u") == []


def test_topics_listing_is_sorted_and_includes_system_topics(registry: Registry) -> None:
    registry.register_broker("b", "h:2", [("orders", 2), ("%DLQ%billing", 1)])
    registry.register_broker("a", "h:1", [("orders", 3), ("zeta", 1), ("empty", 0)])
    assert registry.topics() == [
        ("%DLQ%billing", [("b", 1)]),
        ("orders", [("a", 3), ("b", 2)]),
        ("zeta", [("a", 1)]),
    ]


@pytest.mark.parametrize("address", ["", "host", "host:", ":80", "host:0", "host:65536", "host:x",
                                     "h ost:1", "::1:80", "[::1:80"])
def test_bad_addresses_are_refused(registry: Registry, address: str) -> None:
    with pytest.raises(InvalidFieldError) as info:
        registry.register_broker("a", address)
    assert info.value.field == "broker.address"
    with pytest.raises(InvalidFieldError):
        registry.register_checker("c", address)


@pytest.mark.parametrize("address", ["broker-0.txmq-broker:10911", "127.0.0.1:1", "[::1]:9876"])
def test_good_addresses(address: str) -> None:
    assert validate_address("a", address) == address


def test_bad_registrations_are_refused(registry: Registry) -> None:
    with pytest.raises(InvalidFieldError) as info:
        registry.register_broker("", "h:1")
    assert info.value.field == "broker.name"
    with pytest.raises(InvalidFieldError):
        registry.register_checker("", "h:1")
    with pytest.raises(InvalidFieldError):
        registry.register_broker("a", "h:1", [("t", 1), ("t", 2)])
    with pytest.raises(InvalidFieldError):
        registry.register_broker("a", "h:1", [("t", -1)])
    with pytest.raises(InvalidNameError):
        registry.register_broker("a", "h:1", [("bad topic", 1)])
    assert registry.live_brokers() == []


# --- spreading and creation -------------------------------------------------------------

@pytest.mark.parametrize(("total", "brokers", "expected"), [
    (8, ["c", "a", "b"], [("a", 3), ("b", 3), ("c", 2)]),
    (2, ["a", "b", "c"], [("a", 1), ("b", 1)]),
    (4, ["only"], [("only", 4)]),
    (6, ["b", "a"], [("a", 3), ("b", 3)]),
    (3, [], []),
])
def test_spread_queues_round_robin_by_name(total: int, brokers: list[str], expected: list) -> None:
    assert spread_queues(total, brokers) == expected


def test_spread_queues_conserves_the_total() -> None:
    for total in range(1, 40):
        for n in range(1, 7):
            shares = spread_queues(total, [f"b{i}" for i in range(n)])
            assert sum(c for _, c in shares) == total
            assert max(c for _, c in shares) - min(c for _, c in shares) <= 1


@pytest.mark.parametrize(("requested", "expected"), [(0, 4), (1, 1), (1024, 1024)])
def test_queue_count_default_and_bounds(requested: int, expected: int) -> None:
    assert resolve_queue_count(requested, 4) == expected


@pytest.mark.parametrize("requested", [-1, 1025])
def test_queue_count_out_of_bounds(requested: int) -> None:
    with pytest.raises(InvalidFieldError) as info:
        resolve_queue_count(requested, 4)
    assert info.value.field == "queue_count"


def test_auto_create_decision() -> None:
    assert should_auto_create("orders", enabled=True)
    assert not should_auto_create("orders", enabled=False)
    assert not should_auto_create("%DLQ%billing", enabled=True)
    assert not should_auto_create("%DISCARD%payments", enabled=True)


def test_plan_topic_spreads_over_live_brokers(registry: Registry, clock: FakeClock) -> None:
    registry.register_broker("c", "hc:1")
    registry.register_broker("a", "ha:1")
    registry.register_broker("dead", "hd:1")
    clock.advance(20)
    registry.register_broker("c", "hc:1")
    registry.register_broker("a", "ha:1")
    registry.register_broker("b", "hb:1")
    clock.advance(15)  # "dead" expired
    plan = registry.plan_topic("orders", 8)
    assert [(s.broker_name, s.broker_address, s.queue_count, s.present) for s in plan] == [
        ("a", "ha:1", 3, 0), ("b", "hb:1", 3, 0), ("c", "hc:1", 2, 0)]


def test_plan_topic_without_brokers(registry: Registry) -> None:
    with pytest.raises(NoBrokerError):
        registry.plan_topic("orders", 4)


def test_plan_topic_refuses_an_existing_topic_but_completes_a_partial_one(registry: Registry) -> None:
    registry.register_broker("a", "ha:1", [("orders", 3)])
    registry.register_broker("b", "hb:1")
    registry.register_broker("c", "hc:1", [("orders", 2)])
    # A creation of 8 where b failed: a retry creates only b's share.
    plan = registry.plan_topic("orders", 8)
    assert [(s.broker_name, s.missing) for s in plan] == [("a", False), ("b", True), ("c", False)]
    registry.record_topic_queues("b", "orders", 3)
    with pytest.raises(TopicExistsError) as info:
        registry.plan_topic("orders", 8)
    assert info.value.topic == "orders"
    with pytest.raises(TopicExistsError):
        registry.plan_topic("orders", 4)


def test_created_queues_are_routed_before_the_next_heartbeat(registry: Registry, clock: FakeClock) -> None:
    registry.register_broker("a", "ha:1", [("old", 1)])
    registry.record_topic_queues("a", "orders", 2)
    assert len(registry.route("orders")) == 2
    # A heartbeat built before the creation (no "orders") does not hide the new queues...
    clock.advance(1)
    registry.register_broker("a", "ha:1", [("old", 1)])
    assert len(registry.route("orders")) == 2
    # ...and once a registration lists them, the broker's word is the only one again.
    registry.register_broker("a", "ha:1", [("old", 1), ("orders", 2)])
    registry.register_broker("a", "ha:1", [("old", 1)])
    assert registry.route("orders") == []


def test_created_queues_the_broker_never_confirms_fade_after_expiry(registry: Registry, clock: FakeClock) -> None:
    registry.register_broker("a", "ha:1")
    registry.record_topic_queues("a", "orders", 2)
    clock.advance(29)
    registry.register_broker("a", "ha:1")
    assert len(registry.route("orders")) == 2
    clock.advance(1)
    registry.register_broker("a", "ha:1")
    assert registry.route("orders") == []


def test_record_topic_queues_of_unknown_broker_is_ignored(registry: Registry) -> None:
    registry.record_topic_queues("ghost", "orders", 2)
    assert registry.route("orders") == []


def test_a_topic_is_fifo_as_its_brokers_register_it_or_as_created(registry: Registry) -> None:
    registry.register_broker("b1", "127.0.0.1:1", [("orders", 2), ("plain", 1)], fifo_topics=["orders"])
    assert registry.is_fifo("orders") and not registry.is_fifo("plain")
    registry.register_broker("b2", "127.0.0.1:2")
    registry.record_topic_queues("b2", "fresh", 2, fifo=True)  # created: FIFO before b2's next heartbeat
    assert registry.is_fifo("fresh")
    registry.register_broker("b2", "127.0.0.1:2")  # a heartbeat already in flight without it
    assert registry.is_fifo("fresh")
    registry.forget_topic_queues("b2", "fresh")
    registry.register_broker("b2", "127.0.0.1:2")
    assert not registry.is_fifo("fresh")


# --- replicated shards between leaders ------------------------------------------------------

LEADER, FOLLOWER = 1, 2


def register_shard(registry: Registry, shard: str, leader: int, epoch: int, topics=(("orders", 2),)) -> None:
    for replica in range(3):
        registry.register_broker(shard, f"h{replica}:{10 + replica}", topics if replica == leader else (),
                                 replica_id=replica, role=LEADER if replica == leader else FOLLOWER, epoch=epoch)


def test_a_shard_between_leaders_keeps_its_topics_known(registry: Registry, clock: FakeClock) -> None:
    register_shard(registry, "b", leader=0, epoch=1)
    assert registry.leaderless_shards("orders") == []
    registry.unregister_broker("b", 0)  # the leader left (or stepped down): its followers live
    assert registry.route("orders") == []
    assert registry.leaderless_shards("orders") == ["b"]
    assert registry.leaderless_shards("other") == []
    registry.register_broker("b", "h1:11", [("orders", 2)], replica_id=1, role=LEADER, epoch=2)
    assert len(registry.route("orders")) == 2 and registry.leaderless_shards("orders") == []


def test_a_dead_leader_expiring_before_its_successor_registers_leaves_the_shard_leaderless(
        registry: Registry, clock: FakeClock) -> None:
    register_shard(registry, "b", leader=0, epoch=1)
    clock.advance(20)
    for replica in (1, 2):  # the followers go on heartbeating, the leader died
        registry.register_broker("b", f"h{replica}:1{replica}", replica_id=replica, role=FOLLOWER, epoch=1)
    clock.advance(15)
    assert registry.route("orders") == [] and registry.leaderless_shards("orders") == ["b"]
    clock.advance(30)  # every replica silent: the shard is gone, not between leaders
    assert registry.leaderless_shards("orders") == []


def test_a_leader_stepping_down_leaves_its_shard_leaderless(registry: Registry) -> None:
    register_shard(registry, "b", leader=0, epoch=1)
    registry.register_broker("b", "h0:10", replica_id=0, role=FOLLOWER, epoch=1)
    assert registry.leaderless_shards("orders") == ["b"]


def test_topics_created_or_deleted_through_the_admin_api_are_remembered_per_shard(registry: Registry) -> None:
    register_shard(registry, "b", leader=0, epoch=1)
    registry.record_topic_queues("b", "fresh", 1)
    registry.forget_topic_queues("b", "orders")
    registry.unregister_broker("b", 0)
    assert registry.leaderless_shards("fresh") == ["b"]
    assert registry.leaderless_shards("orders") == []


def test_an_unreplicated_broker_that_expired_is_not_between_leaders(registry: Registry, clock: FakeClock) -> None:
    registry.register_broker("a", "h:1", [("orders", 1)])
    clock.advance(31)
    assert registry.route("orders") == [] and registry.leaderless_shards("orders") == []


# --- after a start: shards not heard from yet ----------------------------------------------

@pytest.mark.parametrize(("uptime", "heard", "expected", "waits"), [
    (1.0, 1, 2, True),     # one shard of two has registered: the other may hold the topic
    (1.0, 2, 2, False),    # every shard heard from: a topic nobody holds is missing
    (1.0, 3, 2, False),    # more than expected (scaled up): as good as all
    (29.9, 1, 2, True),
    (30.0, 1, 2, False),   # the grace is over: the silent shard is taken for gone
    (1.0, 0, 0, False),    # expected unknown: no wait (the no-live-broker case is apart)
    (1.0, 1, 0, False),
])
def test_a_name_server_waits_for_its_expected_shards_for_at_most_the_grace(uptime, heard, expected, waits) -> None:
    assert registering(uptime, 30.0, heard, expected) is waits


def test_the_shards_heard_are_those_whose_topics_are_known(registry: Registry, clock: FakeClock) -> None:
    assert registry.shards_heard() == 0
    registry.register_broker("a", "h:1", [("orders", 2)])
    assert registry.shards_heard() == 1
    # A replicated shard heard from only by a follower: its topics are unknown, not heard.
    registry.register_broker("b", "h1:11", replica_id=1, role=FOLLOWER, epoch=1)
    assert registry.shards_heard() == 1
    registry.register_broker("b", "h0:10", [("orders", 2)], replica_id=0, role=LEADER, epoch=1)
    assert registry.shards_heard() == 2
    registry.unregister_broker("b", 0)  # between leaders: its last leader's topics are kept
    assert registry.shards_heard() == 2
    clock.advance(31)  # every broker silent
    assert registry.shards_heard() == 0
