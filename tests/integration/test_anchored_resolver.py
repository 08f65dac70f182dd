"""Checks answered with no producer online (issue 29, item 5 of What to build): the
checker holds a connection to a group's decisions table, as a role limited to that table,
and answers the group's checks itself while no producer of the group is subscribed. The
producer under test is a separate process SIGKILLed at a fail point; no other instance of
the group ever starts, yet every transaction is decided as its database says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import txmq
from tests.integration.test_anchored_crash import Worker, committed_orders, decision_rows, pg, undecided  # noqa: F401 - fixtures
from tests.integration.test_checks import (BROKER_ENV, CHECK_MAX, CHECKER_ENV, COMMITTED, DISCARDED, LEASE,
                                          PREPARED, ROLLED_BACK, describe)
from tests.support.metrics import metric_sum
from tests.support.postgres import dsn_for, fresh_database
from tests.support.waiting import wait_until
from txmq.anchored import Decisions

pytestmark = pytest.mark.timeout(180)


def test_the_checker_decides_a_group_whose_whole_fleet_is_down(pg, fresh_cluster_factory, unique_name, tmp_path):
    owner = fresh_database(pg)
    database = owner.rsplit("dbname=", 1)[1]
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, body bytea NOT NULL)")
        conn.execute("DO $$ BEGIN CREATE ROLE txmq_resolver LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    done = subprocess.run([sys.executable, "-m", "txmq", "db", "init", "--dsn", owner, "--resolver-role",
                           "txmq_resolver"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    resolver_dsn = dsn_for(pg, database).replace("user=bench", "user=txmq_resolver")
    with psycopg.connect(resolver_dsn) as limited, pytest.raises(psycopg.errors.InsufficientPrivilege):
        limited.execute("SELECT * FROM orders")  # the role sees the decisions table only
    secret = tmp_path / "orders.dsn"
    secret.write_text(resolver_dsn + "\n")
    secret.chmod(0o600)
    group, topic = unique_name("g"), unique_name("orders")
    cluster = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True,
                                    checker_env={**CHECKER_ENV, "TXMQ_RESOLVER_GROUPS": f"{group}={secret}",
                                                 "TXMQ_RESOLVER_IN_PROGRESS_RETRY_SECONDS": "0.2",
                                                 "TXMQ_RESOLVER_SWEEP_INTERVAL_SECONDS": "0.3",
                                                 "TXMQ_RESOLVER_REPAIR_AFTER_SECONDS": "1"})
    cluster.create_topic(topic, 1)
    workers = []
    try:
        for step in ("commit.after", "half.after", "end.inflight"):
            worker = Worker(cluster, owner, topic, group, "--orders", "1", "--no-checks", "--prefix", step,
                            failpoint=step)
            workers.append(worker)
            assert worker.wait_exit(60) == -9, worker.stderr()
        wait_until(lambda: not undecided(cluster, group), 60,
                   message=lambda: f"undecided: {[describe(cluster, t) for t in undecided(cluster, group)]}")
        wait_until(lambda: all(d == "rollback" for _k, d in decision_rows(owner)), 30,
                   message=lambda: f"COMMIT rows left: {decision_rows(owner)}")
    finally:
        for w in workers:
            w.kill()
    committed = committed_orders(owner)
    assert {o.split("-", 1)[0] for o in committed} == {"commit.after", "end.inflight"}
    assert [d for _k, d in decision_rows(owner)] == ["rollback"]  # the fence of half.after's transaction
    answers = {source: metric_sum(cluster.checkers[0].metrics_port, "txmq_resolver_answers_total",
                                  {"group": group, "source": source})
               for source in ("committed", "fenced")}
    assert answers["committed"] >= 1 and answers["fenced"] == 1, answers  # one fence can be inserted
    logs = "".join(cluster.logs(400).values())
    assert "resolver answers the group's checks" in logs
    assert "txmq_resolver" not in logs and str(secret) not in logs.replace(f"{group}={secret}", "")

    # A producer of the group comes back: the resolver leaves the group to it, and takes it
    # again once the producer is gone.
    def said(text: str) -> int:
        return "".join(cluster.logs(400).values()).count(text)

    answering = said("resolver answers the group's checks")
    producer = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, checker_refresh_seconds=0.5,
                                        decisions=Decisions(owner))
    try:
        wait_until(lambda: said("resolver leaves the group to its producers") >= 1, 20)
    finally:
        producer.close()
    wait_until(lambda: said("resolver answers the group's checks") > answering, 20)


def orders_database(pg, tmp_path: Path) -> tuple[str, Path]:
    """A fresh database with ``orders`` and the decisions table (``txmq db init``); its
    connection string, and a 0600 file holding it (a resolver group's secret)."""
    owner = fresh_database(pg)
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, body bytea NOT NULL)")
    done = subprocess.run([sys.executable, "-m", "txmq", "db", "init", "--dsn", owner],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    secret = tmp_path / "orders.dsn"
    secret.write_text(owner + "\n")
    secret.chmod(0o600)
    return owner, secret


def test_the_resolver_keeps_answering_when_its_answers_come_after_the_checks_expired(
        pg, fresh_cluster_factory, unique_name, tmp_path):
    """A slow resolver (here: each check waits 2 s for the key, past the 0.5 s answer
    timeout and the 1 s lease after it, as a loaded machine makes any check) still gets
    checks: every answer gives its check's credit back, and one for a forgotten check names
    its transaction (a late answer). Before, each such answer was dropped with its unit of
    credit, and after ``resolver_concurrency`` of them the group got no checks at all: a
    transaction committed by its crashed producer stayed PREPARED."""
    owner, secret = orders_database(pg, tmp_path)
    group, topic = unique_name("g"), unique_name("orders")
    concurrency = 2
    cluster = fresh_cluster_factory(broker_env={**BROKER_ENV, "TXMQ_CHECK_MAX": "100"}, checker=True,
                                    checker_env={**CHECKER_ENV, "TXMQ_RESOLVER_GROUPS": f"{group}={secret}",
                                                 "TXMQ_RESOLVER_CONCURRENCY": str(concurrency),
                                                 "TXMQ_RESOLVER_LOCK_TIMEOUT_SECONDS": "2.0",
                                                 "TXMQ_RESOLVER_IN_PROGRESS_RETRY_SECONDS": "0.2"})
    cluster.create_topic(topic, 1)
    hold = tmp_path / "release"
    # Holds its local transaction (and so the key) open until ``hold`` exists, then commits
    # and dies before its EndTransaction: only a check can commit the message.
    worker = Worker(cluster, owner, topic, group, "--orders", "1", "--no-checks", "--hold", str(hold),
                    failpoint="commit.after")
    try:
        half = wait_until(lambda: worker.of("half"), 60, message=lambda: f"{worker.events} {worker.stderr()}")[0]
        transaction_id = half["transaction_id"]
        wait_until(lambda: describe(cluster, transaction_id).checks_delivered > 2 * concurrency, 90,
                   message=lambda: f"the resolver stopped taking checks: {describe(cluster, transaction_id)}")
        assert describe(cluster, transaction_id).state == PREPARED  # IN_PROGRESS, never ROLLBACK
        hold.touch()
        assert worker.wait_exit(60) == -9, worker.stderr()
        wait_until(lambda: describe(cluster, transaction_id).state == COMMITTED, 60,
                   message=lambda: f"{describe(cluster, transaction_id)}")
    finally:
        worker.kill()
    assert committed_orders(owner) == {half["half"]}


def test_a_transaction_discarded_while_the_resolver_waited_for_its_key_is_decided_by_the_late_answer(
        pg, fresh_cluster_factory, unique_name, tmp_path):
    """Every check of the transaction outlives its answer timeout and the lease after it
    (the checker forgets it) while the resolver waits for the key its open local
    transaction holds, and the broker discards the transaction after ``check_max`` checks.
    Then the producer dies: the resolver's fence goes in, and its answer, ROLLBACK, though
    for a forgotten check, still decides the transaction (a late answer, named by its
    transaction). Before, that answer was dropped and the transaction stayed DISCARDED."""
    owner, secret = orders_database(pg, tmp_path)
    group, topic = unique_name("g"), unique_name("orders")
    cluster = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True,
                                    checker_env={**CHECKER_ENV, "TXMQ_RESOLVER_GROUPS": f"{group}={secret}",
                                                 "TXMQ_RESOLVER_LOCK_TIMEOUT_SECONDS": "60"})
    cluster.create_topic(topic, 1)
    forgotten_after = float(CHECKER_ENV["TXMQ_ANSWER_TIMEOUT_SECONDS"]) + LEASE

    def fences_waiting_past_forget() -> int:
        """The resolver's fences blocked on the key for longer than a check is remembered."""
        with psycopg.connect(owner, autocommit=True) as conn:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query ILIKE '%%txmq_decisions%%'"
                " AND now() - query_start > make_interval(secs => %s)", (forgotten_after + 1,)).fetchone()[0]

    worker = Worker(cluster, owner, topic, group, "--orders", "1", "--no-checks", "--hold", str(tmp_path / "never"))
    try:
        half = wait_until(lambda: worker.of("half"), 60, message=lambda: f"{worker.events} {worker.stderr()}")[0]
        transaction_id = half["transaction_id"]
        wait_until(lambda: describe(cluster, transaction_id).state == DISCARDED, 60,
                   message=lambda: f"{describe(cluster, transaction_id)}")
        wait_until(lambda: fences_waiting_past_forget() >= CHECK_MAX, 60,
                   message=lambda: f"{fences_waiting_past_forget()} fences waiting")
    finally:
        worker.kill()  # its local transaction rolls back: the waiting fences go in
    wait_until(lambda: describe(cluster, transaction_id).state == ROLLED_BACK, 60,
               message=lambda: f"{describe(cluster, transaction_id)}")
    assert [d for _k, d in decision_rows(owner)] == ["rollback"] and committed_orders(owner) == set()


def test_a_resolver_group_with_an_unreadable_dsn_file_stops_the_checker_with_a_clear_error(tmp_path):
    from services.checker.config import CheckerConfig
    from services.checker.resolver import parse_groups

    CheckerConfig(resolver_groups=(f"g={tmp_path / 'missing'}",)).validate()  # the entry's form is valid
    with pytest.raises(ValueError, match="cannot read the DSN file of group 'g'"):
        parse_groups((f"g={tmp_path / 'missing'}",))
    with pytest.raises(ValueError, match="GROUP=DSN_FILE"):
        CheckerConfig(resolver_groups=("no-equals-sign",)).validate()
