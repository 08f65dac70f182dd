"""Deleting a producer group (``AdminService.DeleteProducerGroup``, ``txmq group
delete-producer``) against real processes: an idle group whose transactions ended goes on
every broker (no longer in GetBrokerStats' groups; a dry run first changes nothing), stays
gone across a restart, and its ended transactions stay readable; a PREPARED transaction
refuses it, forced or not, until it ends; a live producer (its half messages) refuses it
unless forced, and so does an idle one connected to a checker whose claims wait on the
brokers; the CLI; a replicated shard's deletion outlives its leader. Auth and
the quota are in test_tenant_quotas.py."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import txmq
import txmq.aio
from tests.support import presets
from tests.support.cli import txmq_cli
from tests.support.waiting import wait_until
from txmq.v1 import common_pb2

#: Producers are live this long after their last half message or claim (the brokers' setting).
SESSION_SECONDS = 1.5

LocalState = txmq.LocalTransactionState


@pytest.fixture
def cluster(fresh_cluster_factory):
    return fresh_cluster_factory(brokers=2, broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS)})


def producer(cluster, group: str, **kw) -> txmq.TransactionProducer:
    return txmq.TransactionProducer(cluster.nameserver_address, producer_group=group,
                                    checker=lambda _m: LocalState.ROLLBACK, **kw)


def groups_listed(admin: txmq.Admin) -> dict[str, set[str]]:
    """Producer group → the brokers whose GetBrokerStats list its counters."""
    out: dict[str, set[str]] = {}
    for b in admin.broker_stats().brokers:
        for g in b.groups:
            out.setdefault(g.producer_group, set()).add(b.broker_name)
    return out


def wait_not_live(admin: txmq.Admin, group: str) -> None:
    wait_until(lambda: not admin.delete_producer_group(group, dry_run=True).live_producers, SESSION_SECONDS * 20,
               message="the stopped producer stays live")


def test_an_idle_group_goes_on_every_broker_and_stays_gone(cluster, unique_name) -> None:
    topic, group, other = unique_name("pdel"), unique_name("pg"), unique_name("keep")
    cluster.create_topic(topic, queue_count=4)  # over both brokers
    ended = []
    with producer(cluster, group, answer_checks=False) as p, producer(cluster, other, answer_checks=False) as q:
        for i in range(8):
            with p.begin_transaction(key=f"k{i}") as tx:
                p.send(txmq.Message(topic, f"m{i}".encode()), tx)
            ended += tx.messages
        with q.begin_transaction(key="o") as tx:
            q.send(txmq.Message(topic, b"o"), tx)
    assert {m.broker_name for m in ended} == {"broker-0", "broker-1"}
    with txmq.Admin(cluster.nameserver_address) as admin:
        assert groups_listed(admin)[group] == {"broker-0", "broker-1"}
        wait_not_live(admin, group)
        dry = admin.delete_producer_group(group, dry_run=True)
        assert not dry.applied and sorted(b.broker_name for b in dry.brokers) == ["broker-0", "broker-1"]
        assert all(b.counters and not (b.pending or b.discarded or b.global_pushes) for b in dry.brokers)
        assert group in groups_listed(admin)  # a dry run changed nothing
        with pytest.raises(txmq.InvalidFieldError, match="operator"):
            admin.delete_producer_group(group)
        done = admin.delete_producer_group(group, operator="ann", reason="retired service")
        assert done.applied and done.operator == "ann" and not done.unreachable_brokers
        assert sorted(b.broker_name for b in done.brokers) == ["broker-0", "broker-1"]
        listed = groups_listed(admin)
        assert group not in listed and listed[other]  # another group keeps its counters
        decided = admin.describe_transaction(ended[0].transaction_id)  # the decisions stay
        assert decided.transaction.producer_group == group
        with pytest.raises(txmq.ProducerGroupNotFoundError):
            admin.delete_producer_group(group, operator="ann")
    for i in range(2):
        cluster.restart_broker(i)
    with txmq.Admin(cluster.nameserver_address) as admin:
        wait_until(lambda: len(admin.broker_stats().brokers) == 2, 30, message="brokers back")
        assert group not in groups_listed(admin)  # gone from the stores, not only from memory
        with pytest.raises(txmq.ProducerGroupNotFoundError):
            admin.delete_producer_group(group, dry_run=True)


def test_an_open_transaction_refuses_it_forced_or_not_until_it_ends(cluster, unique_name) -> None:
    topic, group = unique_name("pdel"), unique_name("pg")
    cluster.create_topic(topic, queue_count=2)
    with producer(cluster, group, answer_checks=False) as p, txmq.Admin(cluster.nameserver_address) as admin:
        tx = p.begin_transaction(key="open")
        p.send(txmq.Message(topic, b"half"), tx)
        wait_not_live(admin, group)
        dry = admin.delete_producer_group(group, dry_run=True)
        assert sum(b.pending for b in dry.brokers) == 1
        for force in (False, True):
            with pytest.raises(txmq.TransactionsOpenError, match=f"{group}.*1 prepared") as caught:
                admin.delete_producer_group(group, force=force, operator="ann")
            assert caught.value.reason == "TRANSACTIONS_OPEN"
        assert group in groups_listed(admin)
        tx.commit()
        wait_not_live(admin, group)
        assert admin.delete_producer_group(group, operator="ann").applied
        assert group not in groups_listed(admin)


def test_live_producers_refuse_it_unless_forced_and_the_cli(fresh_cluster_factory, unique_name) -> None:
    cluster = fresh_cluster_factory(brokers=2, broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": "30"})
    topic, group = unique_name("pdel"), unique_name("pg")
    cluster.create_topic(topic, queue_count=2)
    with producer(cluster, group, answer_checks=False) as p:
        with p.begin_transaction(key="a") as tx:  # a producer live from its half message
            p.send(txmq.Message(topic, b"a"), tx)
        client = tx.messages[0].broker_name
        with txmq.Admin(cluster.nameserver_address) as admin:
            live = admin.delete_producer_group(group, dry_run=True).live_producers
            assert [(c.kind, c.broker_name) for c in live] == [("producer", client)]
            with pytest.raises(txmq.ProducersLiveError, match=group):
                admin.delete_producer_group(group, operator="ann")
            assert group in groups_listed(admin)
        refused = txmq_cli(cluster, "group", "delete-producer", group, "--operator", "carol")
        assert refused.returncode == 1 and json.loads(refused.stderr)["error"]["reason"] == "PRODUCERS_LIVE"
        dry = txmq_cli(cluster, "group", "delete-producer", group, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["applied"] is False and json.loads(dry.stdout)["live_producers"]
        done = txmq_cli(cluster, "group", "delete-producer", group, "--force", "--operator", "carol")
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["applied"] is True and data["operator"] == "carol"
        with txmq.Admin(cluster.nameserver_address) as admin:
            assert group not in groups_listed(admin)
            with pytest.raises(txmq.ProducerGroupNotFoundError):  # its producers forgotten with it
                admin.delete_producer_group(group, dry_run=True)
        with p.begin_transaction(key="b") as tx:  # a producer that sends again makes it anew
            p.send(txmq.Message(topic, b"b"), tx)
        with txmq.Admin(cluster.nameserver_address) as admin:
            assert group in groups_listed(admin)


def test_an_idle_producer_holding_its_check_stream_refuses_it_unless_forced(fresh_cluster_factory,
                                                                           unique_name) -> None:
    """A producer stays connected (its check stream open to the checker) and sends nothing
    for far longer than the session: the checker's claims for its group, finding nothing
    due, wait on each broker up to claim_wait_seconds (8 s here, past the 1.5 s session). The
    group stays live the whole time, the checker named: refused unless forced. Failed
    before: a held claim was seen only when answered, so for most of each wait the group
    looked idle and was deleted without --force under its connected fleet."""
    cluster = fresh_cluster_factory(brokers=2, broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS)},
                                    checker=True, checker_env={**presets.CHECKER, "TXMQ_CLAIM_WAIT_SECONDS": "8"})
    topic, group = unique_name("pdel"), unique_name("pg")
    cluster.create_topic(topic, queue_count=2)
    with producer(cluster, group) as p, txmq.Admin(cluster.nameserver_address) as admin:
        with p.begin_transaction(key="a") as tx:
            p.send(txmq.Message(topic, b"a"), tx)

        def live() -> list[tuple[str, str]]:
            return sorted((c.kind, c.client_id) for c in admin.delete_producer_group(group, dry_run=True).live_producers)
        wait_until(lambda: live() and all(kind == "checker" for kind, _who in live()), SESSION_SECONDS * 20,
                   message=lambda: f"the producer's half message still live, or no checker: {live()}")
        end = time.monotonic() + 10.0  # longer than a claim's wait: every part of one
        while time.monotonic() < end:
            seen = live()
            assert ("checker", "checker-0") in seen, f"the idle producer's group looked unused: {seen}"
            time.sleep(0.25)
        with pytest.raises(txmq.ProducersLiveError, match="checker-0"):
            admin.delete_producer_group(group, operator="ann")
        assert group in groups_listed(admin)
        assert admin.delete_producer_group(group, force=True, operator="ann").applied
        assert group not in groups_listed(admin)


def test_the_asyncio_admin_dry_run(cluster, unique_name) -> None:
    topic, group = unique_name("pdel"), unique_name("pg")
    cluster.create_topic(topic, queue_count=1)
    with producer(cluster, group, answer_checks=False) as p:
        with p.begin_transaction(key="a") as tx:
            p.send(txmq.Message(topic, b"a"), tx)

    async def run() -> None:
        async with txmq.aio.AsyncAdmin(cluster.nameserver_address) as admin:
            dry = await admin.delete_producer_group(group, dry_run=True)
            assert not dry.applied and [b.counters for b in dry.brokers] == [True]
    asyncio.run(run())


@pytest.mark.timeout(240)
def test_producer_group_delete_replicated(fresh_cluster_factory, unique_name) -> None:
    """RF3: the deletion is one replicated write. Its leader killed after it, the next
    leader knows nothing of the group (no counters row in GetBrokerStats, a dry run finds
    no such group) while the group's ended transactions still answer with their decisions,
    and a half message of the group makes it anew there; every replica's store agrees."""
    from tests.support import replicas

    cluster = fresh_cluster_factory(brokers=1, replication_factor=3,
                                    broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS)})
    topic, group = unique_name("rf3"), unique_name("pg")
    cluster.create_topic(topic, 2)
    ended: list[txmq.SendReceipt] = []
    with producer(cluster, group, answer_checks=False) as p:
        for i in range(4):
            with p.begin_transaction(key=f"k{i}") as tx:
                p.send(txmq.Message(topic, f"m{i}".encode()), tx)
            ended += tx.messages
    with txmq.Admin(cluster.nameserver_address) as admin:
        assert groups_listed(admin)[group] == {"broker-0"}
        wait_not_live(admin, group)
        assert admin.delete_producer_group(group, operator="frank").applied
    replicas.wait_in_sync(cluster, "broker-0")
    old = cluster.wait_leaders()["broker-0"]
    old.kill()
    cluster.wait_leaders(not_on=old)
    with txmq.Admin(cluster.nameserver_address) as admin:
        with pytest.raises(txmq.ProducerGroupNotFoundError):
            wait_until(lambda: admin.delete_producer_group(group, dry_run=True), 30, ignore=(txmq.UnavailableError,))
        assert group not in groups_listed(admin)
        for m in ended:  # the decisions stay, on the new leader
            decided = admin.describe_transaction(m.transaction_id).transaction
            assert (decided.producer_group, decided.state) == (group, common_pb2.TRANSACTION_STATE_COMMITTED)
        with producer(cluster, group, answer_checks=False) as p:
            with p.begin_transaction(key="again") as tx:
                p.send(txmq.Message(topic, b"again"), tx)
        assert groups_listed(admin)[group] == {"broker-0"}
    old.restart(60)
    replicas.stop_and_compare(cluster, "broker-0")
