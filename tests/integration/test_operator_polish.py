"""What an operator reads (issue 32, item 5), against real processes: a namespace's
transaction listing is filtered on the brokers (before their limit) and says when it is
cut; keys as a column and ``--key`` in ``txn list``; ``Admin.create_topic(exist_ok=True)``
as ``topic create --exist-ok``; a drained shard shows in ``broker list`` and
``broker status``; ``--json`` errors are JSON objects and missing values null; a refused
field is named as the command's option in the text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

import txmq
import txmq.errors
from tests.support.cli import txmq_cli
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState


class Commit(txmq.TransactionListener):
    def execute_local_transaction(self, message, arg):
        return LocalState.COMMIT

    def check_local_transaction(self, message):
        return LocalState.COMMIT


def _text(cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI's table output, whole (piped: not cut to a terminal's width)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, *args],
                          capture_output=True, text=True, timeout=120, env=env)


def _commit_many(cluster, group: str, topic: str, count: int, *, namespace: str = "", keys=()) -> None:
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=Commit(),
                                  namespace=namespace) as producer:
        for i in range(count):
            producer.send_in_transaction(txmq.Message(topic, f"m{i}".encode(), keys=keys))


def test_a_namespace_listing_is_filtered_on_the_broker_and_says_when_it_is_cut(cluster, unique_name) -> None:
    run = uuid.uuid4().hex[:8]
    noisy, topic, ns = f"noisy-{run}", f"orders-{run}", f"ns{run}"
    cluster.create_topic(topic, queue_count=1)
    cluster.create_topic(f"{ns}%{topic}", queue_count=1)
    _commit_many(cluster, noisy, topic, 150)
    _commit_many(cluster, "billing", topic, 5, namespace=ns)
    with txmq.Admin(cluster.nameserver_address, namespace=ns) as admin:
        listed = admin.list_transactions()  # limit 100 per broker, 150 others came first
        assert len(listed.transactions) == 5 and not listed.truncated
        assert {t.producer_group for t in listed.transactions} == {f"{ns}%billing"}
        cut = admin.list_transactions(limit=3)
        assert len(cut.transactions) == 3 and cut.truncated and list(cut.truncated_brokers) == ["broker-0"]
    done = txmq_cli(cluster, "--namespace", ns, "txn", "list")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert len(data["transactions"]) == 5 and data["truncated"] is False
    done = _text(cluster, "--namespace", ns, "txn", "list", "--limit", "2")
    assert done.returncode == 0, done.stderr
    assert "cut at --limit 2 per broker on broker-0" in done.stdout


def test_txn_list_shows_keys_and_filters_by_key(cluster, unique_name) -> None:
    topic, group = unique_name("keyed"), unique_name("pg")
    cluster.create_topic(topic, queue_count=1)
    _commit_many(cluster, group, topic, 3, keys=("order-1", "customer-9"))
    _commit_many(cluster, group, topic, 2, keys=("order-2",))
    done = txmq_cli(cluster, "txn", "list", "--group", group, "--key", "order-2")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["transactions"]
    assert len(rows) == 2 and all(r["keys"] == ["order-2"] for r in rows)
    done = _text(cluster, "txn", "list", "--group", group)
    assert "KEYS" in done.stdout.splitlines()[0] and "order-1,customer-9" in done.stdout


def test_create_topic_exist_ok_matches_the_cli(cluster, unique_name) -> None:
    topic = unique_name("declared")
    with txmq.Admin(cluster.nameserver_address) as admin:
        created = admin.create_topic(topic, queue_count=2)
        assert sum(b.queue_count for b in created.brokers) == 2
        with pytest.raises(txmq.TopicExistsError):
            admin.create_topic(topic, queue_count=2)
        again = admin.create_topic(topic, queue_count=2, exist_ok=True)
        assert again.topic == topic and sum(b.queue_count for b in again.brokers) == 2
        with pytest.raises(txmq.errors.TopicTypeMismatchError, match="exists as a NORMAL topic, not FIFO"):
            admin.create_topic(topic, queue_count=2, fifo=True, exist_ok=True)


def test_json_errors_are_objects_naming_the_field(cluster) -> None:
    done = txmq_cli(cluster, "txn", "list", "--group", "not a group!")
    assert done.returncode == 1
    error = json.loads(done.stderr)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and error["field"] == "producer_group" and error["message"]
    done = txmq_cli(cluster, "topic", "describe", "no-such-topic-anywhere")
    error = json.loads(done.stderr)["error"]
    assert done.returncode == 1 and error["code"] == "NOT_FOUND" and error["field"] is None
    done = txmq_cli(cluster, "txn", "list", "--limit", "zero")
    assert done.returncode == 2
    error = json.loads(done.stderr)["error"]
    assert error["code"] == "USAGE" and "--limit" in error["message"]


def test_a_refused_field_is_named_as_the_option_to_fix_and_json_keeps_the_field(cluster, unique_name) -> None:
    topic = unique_name("flags")
    cluster.create_topic(topic, queue_count=1)
    done = _text(cluster, "message", "print", topic, "--queue", "0", "--offset", "0", "--broker", "nosuch")
    assert done.returncode == 1
    assert done.stderr.strip() == f"txmq: --broker: 'nosuch' holds no queue of {topic!r}"
    done = txmq_cli(cluster, "message", "print", topic, "--queue", "0", "--offset", "0", "--broker", "nosuch")
    assert done.returncode == 1 and json.loads(done.stderr)["error"]["field"] == "broker_name"


def test_json_shows_missing_values_as_null(cluster, unique_name) -> None:
    topic, group = unique_name("nulls"), unique_name("pg")
    cluster.create_topic(topic, queue_count=1)
    _commit_many(cluster, group, topic, 1)
    done = txmq_cli(cluster, "txn", "list", "--group", group)
    row = json.loads(done.stdout)["transactions"][0]
    assert row["discarded_at"] is None and row["discard_reason"] is None and row["operator"] is None
    assert row["next_check_at"] is None and row["ended_at"]  # set ones stay as they are


def test_a_drained_shard_shows_in_broker_list_and_status(fresh_cluster) -> None:
    done = txmq_cli(fresh_cluster, "broker", "drain", "broker-0")
    assert done.returncode == 0, done.stderr

    def listed_draining() -> bool:
        brokers = json.loads(txmq_cli(fresh_cluster, "broker", "list").stdout)["brokers"]
        return [b["draining"] for b in brokers] == [True]

    wait_until(listed_draining, 30, message="broker list never showed the drained shard")
    status = json.loads(txmq_cli(fresh_cluster, "broker", "status").stdout)["brokers"]
    assert [b["draining"] for b in status] == [True]
    text = _text(fresh_cluster, "broker", "status").stdout
    assert "DRAINING" in text
    done = txmq_cli(fresh_cluster, "broker", "drain", "broker-0", "--undo")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: not listed_draining(), 30, message="broker list still shows the shard draining")


def test_group_clients_lists_live_receivers_and_a_producer_groups_checkers(fresh_cluster_factory,
                                                                          unique_name) -> None:
    cluster = fresh_cluster_factory(checker=True)
    topic, group, producer_group = unique_name("clients"), unique_name("cg"), unique_name("pg")
    cluster.create_topic(topic, queue_count=1)
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.2) as c, \
            txmq.TransactionProducer(cluster.nameserver_address, producer_group=producer_group,
                                     listener=Commit()) as producer:
        c.receive()
        done = txmq_cli(cluster, "group", "clients", group)
        assert done.returncode == 0, done.stderr
        clients = json.loads(done.stdout)["clients"]
        assert [(k["kind"], k["topics"], k["broker"]) for k in clients] == [("consumer", [topic], "broker-0")]
        # Named as the consumer instance (host@pid@random), its connection's address beside it.
        assert clients[0]["client_id"] == c.client_id and clients[0]["address"] != c.client_id
        producer.send_in_transaction(txmq.Message(topic, b"x"))  # the checker serves the group from now on

        def checkers() -> list[dict]:
            listed = json.loads(txmq_cli(cluster, "group", "clients", producer_group).stdout)["clients"]
            return [k for k in listed if k["kind"] == "checker"]

        served = wait_until(checkers, 30, message="no checker claimed the producer group's checks")
        assert served[0]["capacity"] >= 1 and served[0]["client_id"]
    text = _text(cluster, "group", "clients", unique_name("nobody")).stdout
    assert "0 client(s)" in text


def test_an_asyncio_consumer_is_named_by_its_client_id_too(cluster, unique_name) -> None:
    import asyncio

    import txmq.aio

    topic, group = unique_name("aclients"), unique_name("cg")
    cluster.create_topic(topic, queue_count=1)

    async def receive_once() -> str:
        async with txmq.aio.AsyncSimpleConsumer(cluster.nameserver_address, consumer_group=group,
                                                subscriptions={topic: "*"}, await_duration_seconds=0.2) as c:
            await c.receive()
            return c.client_id

    client_id = asyncio.run(receive_once())
    clients = json.loads(txmq_cli(cluster, "group", "clients", group).stdout)["clients"]
    assert [k["client_id"] for k in clients] == [client_id]  # live for consumer_session_seconds after


def test_the_asyncio_admin_resets_finds_and_creates_as_the_sync_one(cluster, unique_name) -> None:
    import asyncio

    import txmq.aio

    topic, group = unique_name("aadmin"), unique_name("cg")
    cluster.create_topic(topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as p:
        sent = [p.send(txmq.Message(topic, f"m{i}".encode(), keys=("k-1",))) for i in range(3)]

    async def operate() -> None:
        async with txmq.aio.AsyncAdmin(cluster.nameserver_address) as admin:
            again = await admin.create_topic(topic, queue_count=1, exist_ok=True)
            assert [(b.broker_name, b.queue_count) for b in again.brokers] == [("broker-0", 1)]
            with pytest.raises(txmq.errors.TopicExistsError):
                await admin.create_topic(topic, queue_count=1)
            found = await admin.find_messages(topic, "k-1")
            assert sorted(m.message.message.message_id for m in found.messages) == sorted(r.message_id for r in sent)
            got = await admin.get_message(sent[0].message_id)
            assert got.message.message.body == b"m0"
            read = await admin.read_messages(topic, 0, sent[1].queue_offset)
            assert [m.message.message.body for m in read.messages] == [b"m1"]
            plan = await admin.reset_offsets(group, topic, to_offsets={0: 1000})
            assert not plan.applied and [(q.new_offset, q.clamped) for q in plan.queues] == [(3, True)]
            done = await admin.reset_offsets(group, topic, shift=1, dry_run=False, operator="async-ops")
            assert done.applied and done.operator == "async-ops"
            assert (await admin.group_clients(group)).clients == []
            listed = await admin.list_transactions(key="k-1", limit=1)
            assert not listed.truncated and list(listed.transactions) == []  # sent, not transactional

    asyncio.run(operate())
