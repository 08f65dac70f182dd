"""Producers keep their throughput when one shard fails (issue 21): real name server, two
brokers and a checker; one broker SIGKILLed under a transactional load.

Nothing here is timed: a window ends once a number of transactions returned (or at a
generous deadline), and what keeps the throughput is counted — how many sends paid a failed
attempt on the dead shard (only those in flight at the kill and the fault table's probes,
`rerouted_bound`), and how many the healthy shard carried in a window of as many
transactions as before. The rates themselves, before, during and after, are
``bench.failover``'s (a rate ratio failed here at 0.69 on a loaded machine with the routing
doing its job).
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

import txmq
from txmq.errors import error_from_rpc
from txmq.v1 import admin_pb2, common_pb2
from tests.support import holdsync
from tests.support.failover import (CommitListener, CommitLoad, describe, drain, pending, rerouted_bound,
                                    sent_to_again, shard_failures, shard_successes, table)
from tests.support.holdsync import SyncGate
from tests.support.waiting import wait_until

#: The name server drops a broker after three missed heartbeats (0.5 s each in tests).
NAMESERVER_ENV = {"TXMQ_BROKER_EXPIRY_SECONDS": "1.5"}
#: Each window lasts about this long at the rate measured while warming up.
WINDOW_SECONDS = 4.0
WINDOW_DEADLINE_SECONDS = 30.0
#: Each local transaction takes this long (a database write), as in a service: the load (~80
#: transactions a second) is one broker can carry alone even on a machine loaded many times
#: over, so the comparison measures routing, not how much CPU one broker process gets
#: against two (bench.failover measures the full-speed case).
LOCAL_TRANSACTION_SECONDS = 0.05


# Heavy although it waits more than it computes (8 s of CPU in 22 s): its windows' rates are
# compared, and a heavy test starting beside one window only would slow its calls alone.
@pytest.mark.heavy  # a throughput comparison
def test_one_shard_down_keeps_throughput_and_delivers_every_commit_once(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(brokers=2, checker=True, nameserver_env=NAMESERVER_ENV)
    topic, group = unique_name("orders"), unique_name("orders-producers")
    cluster.create_topic(topic, 4)
    assert {q.broker_name for q in cluster.query_route(topic)} == {"broker-0", "broker-1"}
    listener = CommitListener(LOCAL_TRANSACTION_SECONDS)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                  checker_refresh_seconds=0.5) as producer:
        wait_until(lambda: producer.connected_checkers(), 10, message="producer not subscribed to the checker")
        load = CommitLoad(producer, topic, threads=4).start()
        try:
            load.window(100, WINDOW_DEADLINE_SECONDS)  # streams open, routes cached
            size = max(200, int(load.window(200, WINDOW_DEADLINE_SECONDS).rate * WINDOW_SECONDS))
            before = load.window(size, WINDOW_DEADLINE_SECONDS)
            assert shard_successes(producer, "broker-1") > 0
            rerouted_before = producer.routing_stats().rerouted
            cluster.kill_broker(1)
            during = load.window(size, WINDOW_DEADLINE_SECONDS)
            rerouted_during = producer.routing_stats().rerouted - rerouted_before
            assert producer.routing_stats().avoided == ("broker-1",) or not any(
                q.broker_name == "broker-1" for q in cluster.query_route(topic))
            cluster.restart_broker(1)
            back_after = sent_to_again(producer, "broker-1")
            after = load.window(size, WINDOW_DEADLINE_SECONDS)
        finally:
            load.stop()
        report = table([("before", before), ("during", during), ("after", after)])
        stats = producer.routing_stats()
        print(f"\n{report}\n  broker-1 sent to again {back_after:.2f}s after it registered; {stats}")
        assert load.errors == [], f"calls failed to the application: {load.errors[:3]}"
        # Throughput kept, counted rather than timed (the rates are bench.failover's): the
        # outage window completed, and only the callers in flight at the kill and the fault
        # table's probes paid a failed attempt on broker-1; a caller stuck on it would pay
        # at every call.
        assert during.transactions >= size, f"the load stalled while broker-1 was down:\n{report}"
        assert rerouted_during <= rerouted_bound(load.threads, during.seconds), \
            f"{rerouted_during} sends paid the dead shard in {during.seconds:.1f}s:\n{report}"
        assert [s.failures > 0 for s in stats.shards] == [False, True], stats
        assert producer.routing_stats().avoided == ()

        # Every committed transaction is delivered once once broker-1 is back, including
        # those whose EndTransaction was lost (the check commits them); the attempts left
        # behind on broker-1 (stored, answer lost) are rolled back, never delivered.
        assert_every_commit_delivered_once(cluster, load, topic, group, unique_name("audit"))


def assert_every_commit_delivered_once(cluster, load: CommitLoad, topic: str, group: str, audit_group: str) -> None:
    expected = set(load.committed)
    try:
        bodies = drain(cluster, topic, audit_group, expected)
    except AssertionError:
        print([(t, describe(cluster, t)) for t in load.end_errors])
        raise
    duplicates = {b for b in bodies if bodies.count(b) > 1}
    assert not duplicates, f"{len(duplicates)} messages delivered twice"
    assert set(bodies) == expected, f"not committed yet delivered: {sorted(set(bodies) - expected)[:5]}"
    wait_until(lambda: not pending(cluster, group), 15,
               message=lambda: f"transactions left pending: {pending(cluster, group)[:3]}")


#: Its five windows may each take WINDOW_DEADLINE_SECONDS on a loaded machine, with six
#: replicas to start and every commit to audit: more than the suite's default 120 s (it
#: timed out so at load ~75, while passing in 52 s at that load when its windows ran fast).
@pytest.mark.timeout(300)
@pytest.mark.heavy  # a throughput comparison on six replicas and etcd: 22 s of CPU in 21 s
def test_a_leader_killed_under_load_costs_the_other_shards_traffic_nothing(fresh_cluster_factory, unique_name):
    """Replicated shards (RF=3 on etcd, 1 s leases in tests): the leader of broker-1 is
    SIGKILLed under the load. While a follower takes over, new sends go to broker-0, whose
    own traffic loses nothing; broker-1 gets sends again from its new leader, no call fails,
    and every commit is delivered once."""
    cluster = fresh_cluster_factory(brokers=2, replication_factor=3, checker=True, nameserver_env=NAMESERVER_ENV)
    cluster.wait_leaders()
    topic, group = unique_name("orders"), unique_name("orders-producers")
    cluster.create_topic(topic, 4)
    listener = CommitListener(LOCAL_TRANSACTION_SECONDS)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                  checker_refresh_seconds=0.5) as producer:
        wait_until(lambda: producer.connected_checkers(), 10, message="producer not subscribed to the checker")
        load = CommitLoad(producer, topic, threads=4).start()
        try:
            load.window(100, WINDOW_DEADLINE_SECONDS)  # streams open, routes cached
            size = max(200, int(load.window(200, WINDOW_DEADLINE_SECONDS).rate * WINDOW_SECONDS))
            healthy_shard = shard_successes(producer, "broker-0")
            before = load.window(size, WINDOW_DEADLINE_SECONDS)
            healthy_before = shard_successes(producer, "broker-0") - healthy_shard
            old = cluster.leader("broker-1")
            assert old is not None and shard_successes(producer, "broker-1") > 0
            rerouted_before, healthy_failures = producer.routing_stats().rerouted, shard_failures(producer, "broker-0")
            old.kill()
            healthy_shard = shard_successes(producer, "broker-0")
            during = load.window(size, WINDOW_DEADLINE_SECONDS)
            healthy_during = shard_successes(producer, "broker-0") - healthy_shard
            rerouted_during = producer.routing_stats().rerouted - rerouted_before
            healthy_failures = shard_failures(producer, "broker-0") - healthy_failures
            new = cluster.wait_leaders(shards=["broker-1"], not_on=old)["broker-1"]
            back_after = sent_to_again(producer, "broker-1")
            after = load.window(size, WINDOW_DEADLINE_SECONDS)
        finally:
            load.stop()
        report = table([("before", before), ("during", during), ("after", after)])
        print(f"\n{report}\n  broker-0 sends: {healthy_before} before, {healthy_during} during; broker-1 "
              f"(new leader {new.name}) sent to again {back_after:.2f}s after it was routed; "
              f"{producer.routing_stats()}")
        assert load.errors == [], f"calls failed to the application: {load.errors[:3]}"
        # Counted rather than timed (the rates are bench.failover's): the window of `size`
        # transactions completed; only the callers in flight at the kill and the fault
        # table's probes paid a failed attempt on broker-1 (the callers whose end was in
        # flight there retry it on its shard, backed off, and leave it to the checker);
        # broker-0 answered every call and, in a window of as many transactions as before,
        # carried at least its own share again (broker-1's on top while it had no leader).
        assert during.transactions >= size, f"the load stalled while broker-1's leader was down:\n{report}"
        assert rerouted_during <= rerouted_bound(load.threads, during.seconds), \
            f"{rerouted_during} sends paid the dead leader in {during.seconds:.1f}s:\n{report}"
        assert healthy_failures == 0, report
        assert healthy_during >= 0.8 * healthy_before, report
        assert_every_commit_delivered_once(cluster, load, topic, group, unique_name("audit"))


@pytest.mark.timeout(300)
@pytest.mark.heavy  # six replicas and etcd under a transactional load
def test_both_leaders_killed_at_once_cost_only_the_calls_in_flight_and_the_probes(fresh_cluster_factory,
                                                                                 unique_name):
    """Replicated shards: the leaders of broker-0 and broker-1 SIGKILLed together (one node
    held both). No shard is usable while their followers take over, so a send that failed
    on one and then on the other stays there, backed off, as a send to a one-shard topic
    does; it used to bounce back to the first dead leader at once and spend its attempts in
    milliseconds (124 failed calls in such a window, where these bounds allow about 14).
    Counted, not timed: only the callers in flight at the kill and the fault table's probes
    may fail (retryably), and every commit is delivered once."""
    cluster = fresh_cluster_factory(brokers=2, replication_factor=3, checker=True, nameserver_env=NAMESERVER_ENV)
    cluster.wait_leaders()
    topic, group = unique_name("orders"), unique_name("orders-producers")
    cluster.create_topic(topic, 4)
    listener = CommitListener(LOCAL_TRANSACTION_SECONDS)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                  checker_refresh_seconds=0.5) as producer:
        wait_until(lambda: producer.connected_checkers(), 10, message="producer not subscribed to the checker")
        load = CommitLoad(producer, topic, threads=4).start()
        try:
            load.window(100, WINDOW_DEADLINE_SECONDS)  # streams open, routes cached
            assert shard_successes(producer, "broker-0") > 0 and shard_successes(producer, "broker-1") > 0
            old = cluster.wait_leaders()
            killed = time.monotonic()
            for leader in old.values():
                leader.kill()
            for shard, leader in old.items():
                cluster.wait_leaders(shards=[shard], not_on=leader)
            between_leaders = time.monotonic() - killed
            for shard in old:
                sent_to_again(producer, shard)
            failed_then = len(load.errors)
            load.window(100, WINDOW_DEADLINE_SECONDS)
        finally:
            load.stop()
        bound = rerouted_bound(load.threads, between_leaders + 1.0)  # + the routes' refresh
        assert failed_then <= bound, (f"{failed_then} calls failed in the {between_leaders:.1f} s both shards were "
                                      f"between leaders (at most {bound} may): {load.errors[:3]}")
        assert len(load.errors) == failed_then, f"calls failed after both shards led again: {load.errors[failed_then:]}"
        assert all(getattr(e, "retryable", False) for e in load.errors), load.errors[:3]
        assert_every_commit_delivered_once(cluster, load, topic, group, unique_name("audit"))


@pytest.fixture(scope="module")
def gate_library(tmp_path_factory: pytest.TempPathFactory):
    return holdsync.build(tmp_path_factory.mktemp("holdsync"))


class BusinessKeyListener(txmq.TransactionListener):
    """Answers checks by the message body (a business key), as an application that does not
    record transaction ids would: an orphan of a committed key would be committed too."""

    def __init__(self) -> None:
        self.committed: set[bytes] = set()
        self.checked: list[str] = []

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> txmq.LocalTransactionState:
        self.committed.add(message.body)
        return txmq.LocalTransactionState.COMMIT

    def check_local_transaction(self, message: txmq.TransactionMessage) -> txmq.LocalTransactionState:
        self.checked.append(message.message_id)
        return (txmq.LocalTransactionState.COMMIT if message.body in self.committed
                else txmq.LocalTransactionState.ROLLBACK)


def test_half_message_stored_but_unanswered_is_rolled_back_by_the_producer(
        fresh_cluster_factory, unique_name, gate_library, tmp_path, monkeypatch):
    """broker-1 stores the half message but its answer never comes (its WAL sync is held);
    the send moves to broker-0 and commits there. broker-1 then crashes and restarts with
    the orphan: the producer answers its check ROLLBACK itself, so the message is delivered
    once although the listener would have said COMMIT for its key."""
    cluster = fresh_cluster_factory(brokers=2, checker=True, nameserver_env=NAMESERVER_ENV)
    topic, group = unique_name("orders"), unique_name("orders-producers")
    cluster.create_topic(topic, 2)
    gate = SyncGate(gate_library, tmp_path / "gate")
    gate.install(monkeypatch)
    cluster.restart_broker(1)  # broker-1 alone loads the gate
    monkeypatch.delenv("LD_PRELOAD")
    listener = BusinessKeyListener()
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                  checker_refresh_seconds=0.5, send_timeout_seconds=1.0) as producer:
        wait_until(lambda: producer.connected_checkers(), 10, message="producer not subscribed to the checker")
        gate.hold()
        results = [producer.send_in_transaction(txmq.Message(topic, f"key-{i}".encode())) for i in range(4)]
        assert all(r.state is txmq.TransactionState.COMMITTED and r.broker_name == "broker-0" for r in results)
        assert producer.routing_stats().rerouted >= 1
        assert gate.holding_wal()
        cluster.kill_broker(1)
        gate.release()
        cluster.restart_broker(1)
        wait_until(lambda: not pending(cluster, group), 20,
                   message=lambda: f"orphans left pending: {pending(cluster, group)}")
        expected = {f"key-{i}".encode() for i in range(4)}
        bodies = drain(cluster, topic, unique_name("audit"), expected)
        assert sorted(bodies) == sorted(expected), "an orphan was delivered as a second copy"
        orphans = [t for t in cluster.admin_stub().ListTransactions(admin_pb2.ListTransactionsRequest(
            producer_group=group, state=common_pb2.TRANSACTION_STATE_ROLLED_BACK), timeout=5).transactions]
        assert orphans, "no orphan was stored on broker-1: the test did not exercise a lost answer"
        assert all(t.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK for t in orphans)
        assert listener.checked == [], "the listener was asked about an orphan the producer knew"


def test_a_consumer_of_two_shards_keeps_receiving_from_the_healthy_one(fresh_cluster_factory, unique_name):
    """broker-1 is down: receive() neither raises nor waits on it, and what producers send
    meanwhile (to broker-0, rerouted) arrives; once broker-1 is back its messages do too."""
    cluster = fresh_cluster_factory(brokers=2, nameserver_env=NAMESERVER_ENV)
    topic, group = unique_name("orders"), unique_name("billing")
    cluster.create_topic(topic, 2)
    with txmq.Producer(cluster.nameserver_address) as producer, \
            txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                                await_duration_seconds=0.5) as consumer:
        before = [producer.send(txmq.Message(topic, f"before-{i}".encode())) for i in range(4)]
        assert {r.broker_name for r in before} == {"broker-0", "broker-1"}
        cluster.kill_broker(1)
        sent = [producer.send(txmq.Message(topic, f"during-{i}".encode())) for i in range(20)]
        assert {r.broker_name for r in sent} == {"broker-0"}
        received: list[bytes] = []

        def received_all(bodies: set[bytes]) -> bool:
            batch = consumer.receive(max_messages=32)  # raising fails the test
            consumer.ack_many(batch)
            received.extend(m.body for m in batch)
            return bodies <= set(received)

        wait_until(lambda: received_all({f"during-{i}".encode() for i in range(20)}), 20, interval=0.0,
                   message=lambda: f"received only {sorted(received)}")
        cluster.restart_broker(1)
        wait_until(lambda: received_all({f"before-{i}".encode() for i in range(4)}), 20, interval=0.0,
                   message=lambda: f"broker-1's messages not received: {sorted(received)}")


def test_the_name_servers_settings_decide_how_soon_a_dead_broker_leaves_the_routes(fresh_cluster_factory,
                                                                                    unique_name):
    """The name server asks for a beat every 0.2 s and drops a broker after 0.6 s without
    one; a broker configured to beat every 5 s beats as asked, and leaves the routes within
    a few beats of its SIGKILL."""
    cluster = fresh_cluster_factory(brokers=2, nameserver_env={"TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.2",
                                                                "TXMQ_BROKER_EXPIRY_SECONDS": "0.6"},
                                    broker_env={"TXMQ_HEARTBEAT_INTERVAL_SECONDS": "5.0"})
    topic = unique_name("orders")
    cluster.create_topic(topic, 2)
    beats: set[int] = set()

    def beating() -> bool:
        listed = {b.name: b for b in cluster.list_brokers()}
        assert set(listed) == {"broker-0", "broker-1"}, "a live broker left the routes"
        beats.add(listed["broker-1"].last_heartbeat_ms)
        return len(beats) >= 6

    wait_until(beating, 10, interval=0.05, message=lambda: f"broker-1 beat {len(beats)} times")
    cluster.kill_broker(1)
    killed = time.monotonic()
    wait_until(lambda: {q.broker_name for q in cluster.query_route(topic)} == {"broker-0"}, 5,
               message="the killed broker stays in the routes")
    print(f"broker-1 left the routes {time.monotonic() - killed:.2f}s after its SIGKILL")


def test_sends_and_receives_go_on_while_no_name_server_answers(fresh_cluster_factory, unique_name):
    """The name server is killed (the only one: a one-name-server install, or all of them
    restarting at once). The brokers need no name server, so the clients keep the last
    route they had and traffic goes on: the sync and asyncio SDKs send, a transaction
    commits, a consumer receives, an official client's sends go through the proxy, for longer than the routes' lifetime
    and than ``STALE_ROUTE_RETRY_SECONDS`` (their lookups fail meanwhile). Before, every send
    failed UNAVAILABLE once its route expired. The name server back, routes are asked again:
    a topic created now is sent to."""
    import asyncio

    import txmq.aio
    from services.proxy.protocol import Code, definition_pb2, service_pb2, service_pb2_grpc
    from txmq.routes import STALE_ROUTE_RETRY_SECONDS
    cluster = fresh_cluster_factory(proxies=1, proxy_env={"TXMQ_ROUTE_TTL_SECONDS": "0.3"})
    topic = unique_name("orders")
    cluster.create_topic(topic, 2)
    ttl = 0.3
    proxy = service_pb2_grpc.MessagingServiceStub(cluster.channel(cluster.proxies[0].address))

    def proxy_send(body: str) -> None:
        response = proxy.SendMessage(service_pb2.SendMessageRequest(messages=[definition_pb2.Message(
            topic=definition_pb2.Resource(name=topic), body=body.encode(),
            system_properties=definition_pb2.SystemProperties(message_id=body, message_type=definition_pb2.NORMAL))]),
            timeout=10, metadata=(("x-mq-client-id", "outage"),))
        assert response.status.code == Code.OK, response.status

    async def aio_send(producer: txmq.aio.AsyncProducer, body: str) -> str:
        return (await producer.send(txmq.Message(topic, body.encode()))).message_id

    sent: set[bytes] = set()
    got: set[bytes] = set()
    with txmq.Producer(cluster.nameserver_address, route_refresh_seconds=ttl) as producer, \
            txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                     listener=CommitListener(), route_refresh_seconds=ttl) as transactions, \
            txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=unique_name("g"),
                                subscriptions={topic: "*"}, await_duration_seconds=0.2,
                                route_refresh_seconds=ttl) as consumer:
        loop = asyncio.new_event_loop()
        aio_producer = loop.run_until_complete(_async_producer(cluster.nameserver_address, ttl))
        try:
            def one_round(tag: str) -> None:
                producer.send(txmq.Message(topic, f"sync-{tag}".encode()))
                loop.run_until_complete(aio_send(aio_producer, f"aio-{tag}"))
                proxy_send(f"proxy-{tag}")
                result = transactions.send_in_transaction(txmq.Message(topic, f"txn-{tag}".encode()))
                assert result.state == txmq.TransactionState.COMMITTED and result.end_error is None, result
                sent.update({f"{kind}-{tag}".encode() for kind in ("sync", "aio", "proxy", "txn")})
                for m in consumer.receive(max_messages=16, invisible_duration_seconds=30):
                    consumer.ack(m)
                    got.add(m.body)

            one_round("before")
            cluster.nameservers[0].kill()
            down_at, rounds = time.monotonic(), 0
            # Traffic for longer than two lookup retries (each failing: nobody listens).
            while time.monotonic() - down_at < 2 * STALE_ROUTE_RETRY_SECONDS + ttl or rounds < 5:
                one_round(f"down-{rounds}")
                rounds += 1
            wait_until(lambda: _received(consumer, got) >= sent, timeout=20,
                       message=lambda: f"not received: {sorted(sent - got)}")

            cluster.nameservers[0].restart()
            cluster.wait_brokers_registered()
            later = unique_name("later")
            cluster.create_topic(later, 1)  # waits until the name server routes it
            receipt = producer.send(txmq.Message(later, b"after"))
            aio_receipt = loop.run_until_complete(aio_producer.send(txmq.Message(later, b"after")))
            assert receipt.broker_name == aio_receipt.broker_name == "broker-0"
        finally:
            loop.run_until_complete(aio_producer.close())
            loop.close()
    assert rounds >= 5


def test_a_name_server_restarted_before_a_shard_registers_again_never_creates_its_topic_elsewhere(
        fresh_cluster_factory, unique_name):
    """The name server restarts (remembering nothing) while the broker holding a topic is
    down; the other broker registers at once. A send to the topic, with auto-creation on,
    met a name server that knew no holder and created the topic on the other broker: the
    topic forked (its queues on both once the first came back). With the cluster's shard
    count given (``expected_brokers``), the topic is not known missing until every shard has
    registered (or the grace ran out): the route is NoBrokerError (retryable), the send waits,
    CreateTopic is refused alike, and once the holder is back the topic routes to it alone."""
    cluster = fresh_cluster_factory(brokers=2, nameserver_env={"TXMQ_EXPECTED_BROKERS": "2",
                                                               "TXMQ_REGISTRATION_GRACE_SECONDS": "120"})
    topic = unique_name("orders")
    cluster.create_topic(topic, 1)
    (route,) = cluster.query_route(topic)
    holder = next(i for i, b in enumerate(cluster.brokers) if b.name == route.broker_name)
    other = cluster.brokers[1 - holder]
    cluster.kill_broker(holder)
    cluster.nameservers[0].restart()
    cluster.wait_brokers_registered(brokers=[other])
    for _ in range(3):  # several of the other broker's heartbeats (0.5 s): still not created there
        with pytest.raises(grpc.RpcError) as raised:
            cluster.query_route(topic)
        refused = error_from_rpc(raised.value)
        assert isinstance(refused, txmq.NoBrokerError) and refused.retryable, refused
        assert "1 of the 2 expected shards" in refused.message, refused.message
        time.sleep(0.5)
    with pytest.raises(txmq.NoBrokerError):
        with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=1.0) as producer:
            producer.send(txmq.Message(topic, b"while a shard is silent"))
    with pytest.raises(grpc.RpcError) as raised:
        cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(topic=unique_name("new"), queue_count=2),
                                         timeout=10)
    assert isinstance(error_from_rpc(raised.value), txmq.NoBrokerError)
    cluster.restart_broker(holder)
    routes = cluster.query_route(topic)
    assert [(r.broker_name, r.queue_id) for r in routes] == [(route.broker_name, route.queue_id)]
    assert "every expected shard has registered" in cluster.nameservers[0].log_tail(200)
    with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=10) as producer:
        assert producer.send(txmq.Message(topic, b"after")).broker_name == route.broker_name
    assert topic not in {t.topic for b in cluster.list_brokers() if b.name == other.name for t in b.topics}


async def _async_producer(nameservers: str, ttl: float) -> "txmq.aio.AsyncProducer":
    import txmq.aio
    return txmq.aio.AsyncProducer(nameservers, route_refresh_seconds=ttl)


def _received(consumer: txmq.SimpleConsumer, got: set[bytes]) -> set[bytes]:
    for m in consumer.receive(max_messages=32, invisible_duration_seconds=30):
        consumer.ack(m)
        got.add(m.body)
    return got


def test_a_client_started_as_the_name_server_restarts_waits_for_the_brokers_to_register(fresh_cluster_factory,
                                                                                       unique_name):
    """The name server restarts and its broker has not beaten since (paused here; in life
    it beats within a heartbeat): a new producer's first route lookup meets a name server
    that knows no broker. That is retryable (NoBrokerError, UNAVAILABLE), not the topic's
    absence: the send asks again until its timeout and goes through once the broker is
    back. It failed at once before (TOPIC_NOT_FOUND, or NO_BROKER as a FAILED_PRECONDITION
    with auto-creation on), seen in tests.chaos_anchored's kill-nameserver."""
    cluster = fresh_cluster_factory(brokers=1)
    topic = unique_name("orders")
    cluster.create_topic(topic, 1)
    broker = cluster.brokers[0]
    broker.pause()
    try:
        cluster.nameservers[0].restart()
        with pytest.raises(grpc.RpcError) as raised:
            cluster.query_route(topic)
        refused = error_from_rpc(raised.value)
        assert isinstance(refused, txmq.NoBrokerError) and refused.retryable, refused
        resumed = threading.Timer(1.5, broker.resume)
        resumed.start()
        with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=20) as producer:
            started = time.monotonic()
            receipt = producer.send(txmq.Message(topic, b"after the restart"))
        assert receipt.broker_name == "broker-0"
        assert time.monotonic() - started >= 1.0  # it waited for the broker, it did not find a route at once
        resumed.join()
    finally:
        broker.resume()
