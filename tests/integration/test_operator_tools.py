"""The operator's tools against a live cluster: the ``txmq`` CLI (consumer groups, dead
letters and their re-drive, topic describe, broker status, transaction describe with the
message, the rough edges: a closed pipe, a cut list, a broker's address) and ``txmq.Admin``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import txmq
from tests.support.cluster import Cluster
from tests.support.metrics import metric
from tests.support.waiting import wait_until

CLI_TIMEOUT_SECONDS = 30


def cli(cluster: Cluster, *args: str, columns: int = 200, address: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "txmq", "--nameserver", address or cluster.nameserver_address,
                           *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_SECONDS, env=env)


def cli_json(cluster: Cluster, *args: str) -> dict:
    done = cli(cluster, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def dead_letter(cluster: Cluster, group: str, topic: str, attempts: int = 4) -> list[txmq.ReceivedMessage]:
    """Receives without acknowledging until the broker moves the messages to %DLQ%<group>
    (TEST_BROKER_ENV: 4 delivery attempts); returns the deliveries seen."""
    seen: list[txmq.ReceivedMessage] = []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as consumer:
        def gone() -> bool:
            seen.extend(consumer.receive(max_messages=16, invisible_duration_seconds=0.1))
            return max((m.delivery_attempt for m in seen), default=0) >= attempts and not consumer.receive(
                max_messages=16, invisible_duration_seconds=0.1)
        wait_until(gone, timeout=20, message="messages never dead-lettered")
    return seen


@pytest.fixture
def admin(cluster: Cluster):
    with txmq.Admin(cluster.nameserver_address) as a:
        yield a


def test_group_describe_dlq_list_and_redrive_to_the_group_alone(cluster, admin, unique_name):
    topic, group, other = unique_name("orders"), unique_name("billing"), unique_name("audit")
    admin.create_topic(topic, queue_count=2)
    with txmq.Producer(cluster.nameserver_address) as producer:
        sent = [producer.send(txmq.Message(topic, f"order {i}".encode(), tag="new", keys=(f"k{i}",)))
                for i in range(3)]
    # Another group reads everything once and acknowledges: re-drive must not reach it.
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=other, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as c:
        got: list[txmq.ReceivedMessage] = []
        wait_until(lambda: got.extend(c.receive(16)) or len(got) >= 3)
        c.ack_many(got)

    dead_letter(cluster, group, topic)
    port = cluster.brokers[0].metrics_port
    assert metric(port, "txmq_dead_letters", {"group": group}) == 3
    described = cli_json(cluster, "group", "describe", group)
    assert sum(described["dead_letters"].values()) == 3
    queues = [q for q in described["queues"] if q["topic"] == topic]
    assert sum(q["lag_messages"] for q in queues) == 0 and sum(q["inflight"] for q in queues) == 0
    listed = cli_json(cluster, "group", "list", "--topic", topic)["groups"]
    assert {g["consumer_group"]: g["dead_letters"] for g in listed}[group] == 3

    dlq = cli_json(cluster, "dlq", "list", group)
    assert sorted(m["message_id"] for m in dlq["messages"]) == sorted(s.message_id for s in sent)
    assert {m["topic"] for m in dlq["messages"]} == {topic}
    assert sorted(m["body_utf8"] for m in dlq["messages"]) == ["order 0", "order 1", "order 2"]
    table = cli(cluster, "dlq", "list", group).stdout
    assert "order 1" in table and "3 dead letter(s)" in table

    # Re-drive one by id: only `group` receives it again, with attempt 1.
    one = sent[1].message_id
    redriven = cli_json(cluster, "dlq", "redrive", group, "--ids", one)
    assert redriven["redriven"] == [one] and redriven["not_found"] == []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as c:
        again = wait_until(lambda: c.receive(16), timeout=10)
        assert [(m.message_id, m.delivery_attempt, m.body) for m in again] == [(one, 1, b"order 1")]
        c.ack_many(again)
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=other, subscriptions={topic: "*"},
                             await_duration_seconds=0.2) as c:
        assert c.receive(16) == []
    assert sorted(m["message_id"] for m in cli_json(cluster, "dlq", "list", group)["messages"]) == sorted(
        s.message_id for s in sent if s.message_id != one)

    # The rest with --all; then nothing is left, and re-driving again says so (exit 1).
    assert len(cli_json(cluster, "dlq", "redrive", group, "--all")["redriven"]) == 2
    assert cli_json(cluster, "dlq", "list", group)["messages"] == []
    assert metric(port, "txmq_dead_letters", {"group": group}) == 0
    empty = cli(cluster, "dlq", "redrive", group, "--all")
    assert empty.returncode == 1 and "no dead letters" in empty.stderr
    missing = cli(cluster, "dlq", "redrive", group, "--ids", one)
    assert missing.returncode == 1 and one in missing.stdout + missing.stderr


def test_group_lag_in_flight_and_retrying(cluster, admin, unique_name):
    topic, group = unique_name("events"), unique_name("slow")
    admin.create_topic(topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for _ in range(5):
            producer.send(txmq.Message(topic, b"x"))
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as c:
        first = wait_until(lambda: c.receive(2, invisible_duration_seconds=0.2))
        assert len(first) == 2
        retried = wait_until(lambda: [m for m in c.receive(1, invisible_duration_seconds=30)
                                      if m.delivery_attempt > 1], timeout=10)
        queues = admin.consumer_groups(group).queues
        assert len(queues) == 1
        q = queues[0]
        assert (q.lag_messages, q.ack_offset, q.max_offset) == (5, 0, 5)
        assert q.inflight >= 2 and q.retrying >= 1 and q.lag_seconds > 0
        assert metric(cluster.brokers[0].metrics_port, "txmq_consumer_lag_seconds",
                      {"group": group, "topic": topic}) > 0
        c.ack_many(retried)
    text = cli(cluster, "group", "describe", group).stdout
    assert "LAG AGE" in text and topic in text


def test_group_describe_of_an_unknown_group_is_not_found(cluster):
    done = cli(cluster, "group", "describe", "nobody-reads-this")
    assert done.returncode == 1
    assert "consumer group 'nobody-reads-this'" in done.stderr
    with txmq.Admin(cluster.nameserver_address) as admin, pytest.raises(txmq.ConsumerGroupNotFoundError):
        admin.dead_letters("nobody-reads-this")


def test_topic_describe_shows_queues_and_groups(cluster, admin, unique_name):
    topic, group = unique_name("t"), unique_name("g")
    admin.create_topic(topic, queue_count=3)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for _ in range(4):
            producer.send(txmq.Message(topic, b"x"))
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as c:
        got: list[txmq.ReceivedMessage] = []
        wait_until(lambda: got.extend(c.receive(16)) or len(got) >= 4)
        c.ack_many(got)
    data = cli_json(cluster, "topic", "describe", topic)
    assert len(data["queues"]) == 3 and sum(q["messages"] for q in data["queues"]) == 4
    assert {c["consumer_group"] for c in data["consumers"]} == {group}
    assert sum(c["lag_messages"] for c in data["consumers"]) == 0
    assert "consumer groups:" in cli(cluster, "topic", "describe", topic).stdout
    missing = cli(cluster, "topic", "describe", unique_name("none"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_broker_status(cluster):
    data = cli_json(cluster, "broker", "status")
    assert [b["name"] for b in data["brokers"]] == ["broker-0"]
    b = data["brokers"][0]
    assert b["free_disk_bytes"] > 0 and b["store_bytes"] > 0 and b["max_delivery_attempts"] == 4
    assert "FREE DISK" in cli(cluster, "broker", "status").stdout


def test_broker_elect_on_a_shard_of_one_replica_says_so(cluster):
    """A shard of one replica has no leadership to move: a clear FAILED_PRECONDITION, not
    the broker's UNIMPLEMENTED read as "not a txmq name server"."""
    done = cli(cluster, "broker", "elect", "broker-0", "--replica", "1")
    assert done.returncode == 1
    assert "has one replica" in done.stderr and "not a txmq name server" not in done.stderr, done.stderr
    assert [b["name"] for b in cli_json(cluster, "broker", "status")["brokers"]] == ["broker-0"]


def test_fsck_of_a_running_brokers_store_says_to_stop_it_first(cluster):
    """fsck reads a stopped broker's store; on a running one it says so (no traceback)."""
    done = subprocess.run([sys.executable, "-m", "services.broker.fsck", "--data-dir",
                           str(cluster.workdir / "broker-0")], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_SECONDS)
    assert done.returncode == 2
    assert "open in another process" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_txn_describe_shows_the_message_and_writes_a_binary_body(cluster, unique_name, tmp_path: Path):
    topic, group = unique_name("pay"), unique_name("payer")

    class Unknown(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            return txmq.LocalTransactionState.UNKNOWN

        def check_local_transaction(self, message):
            return txmq.LocalTransactionState.UNKNOWN

    body = bytes(range(256)) * 4
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=Unknown(),
                                  answer_checks=False) as producer:
        result = producer.send_in_transaction(txmq.Message(topic, body, tag="refund", keys=("order-42", "cust-7"),
                                                           properties={"amount": "12.50"}))
    data = cli_json(cluster, "txn", "describe", result.transaction_id)
    assert data["message"]["tag"] == "refund"
    assert data["message"]["keys"] == ["order-42", "cust-7"]
    assert data["message"]["properties"] == {"amount": "12.50"}
    assert data["message"]["body_utf8"] is None and data["message"]["body_size_bytes"] == 1024
    text = cli(cluster, "txn", "describe", result.transaction_id).stdout
    assert "order-42" in text and "amount=12.50" in text and "<binary, 1024 bytes>" in text
    assert "\x00" not in text
    out = tmp_path / "body.bin"
    written = cli(cluster, "txn", "describe", result.transaction_id, "--body-out", str(out))
    assert written.returncode == 0 and out.read_bytes() == body
    # Nobody answers checks: once due, the next check is flagged overdue in list and describe.
    # (Each poll starts a CLI process: seconds apiece on a loaded machine, hence the deadlines;
    # a failed poll's output is kept for the message.)
    described: list[dict] = []
    wait_until(lambda: described.append(cli_json(cluster, "txn", "describe", result.transaction_id))
               or described[-1]["next_check_overdue_seconds"] > 0, timeout=60,
               message=lambda: f"never overdue: {described[-1:]}", ignore=(AssertionError,))
    listed: list[subprocess.CompletedProcess[str]] = []
    wait_until(lambda: listed.append(cli(cluster, "txn", "list", "--group", group)) or "OVERDUE" in listed[-1].stdout,
               timeout=60, message=lambda: f"not listed overdue: {listed[-1].stdout!r} {listed[-1].stderr!r}")
    assert "CHECKS: sent to a producer / answered" in listed[-1].stdout


def test_txn_list_says_when_limit_cut_it_and_fits_the_terminal(cluster, unique_name):
    group = unique_name("many")

    class Rollback(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            return txmq.LocalTransactionState.UNKNOWN

        def check_local_transaction(self, message):
            return txmq.LocalTransactionState.UNKNOWN

    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=Rollback(),
                                  answer_checks=False) as producer:
        for _ in range(3):
            producer.send_in_transaction(txmq.Message(unique_name("t"), b"x"))
    cut = cli(cluster, "txn", "list", "--group", group, "--limit", "2")
    assert "2 transaction(s); cut at --limit 2" in cut.stdout
    assert cli_json(cluster, "txn", "list", "--group", group, "--limit", "2")["truncated"] is True
    whole = cli(cluster, "txn", "list", "--group", group, "--limit", "3")
    assert "3 transaction(s)" in whole.stdout and "cut at" not in whole.stdout
    # Ids are never cut, and a transaction id is 57 characters (its 128-bit authenticator,
    # docs/security.md): the narrow terminal is one that fits them with the other columns cut.
    wide = cli(cluster, "txn", "list", "--group", group, columns=1000)
    assert max(len(line) for line in wide.stdout.splitlines()[:4]) > 130  # the group and topic names are long
    narrow = cli(cluster, "txn", "list", "--group", group, columns=130)
    assert max(len(line) for line in narrow.stdout.splitlines()[:4]) <= 130
    assert "…" in narrow.stdout


def test_a_closed_pipe_ends_quietly(cluster):
    proc = subprocess.Popen([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, "--json",
                             "topic", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the CLI writes (as with `| true`)
    _, err = proc.communicate(timeout=CLI_TIMEOUT_SECONDS)
    assert err.decode() == ""
    assert proc.returncode == 0


def test_a_broker_address_gets_a_clear_error(cluster):
    broker = cluster.brokers[0].address
    done = cli(cluster, "topic", "list", address=broker)
    assert done.returncode == 1
    assert "not a txmq name server" in done.stderr and "Method not found" not in done.stderr


def test_version_and_completion():
    version = subprocess.run([sys.executable, "-m", "txmq", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("txmq 0.")
    script = subprocess.run([sys.executable, "-m", "txmq", "completion", "bash"], capture_output=True, text=True)
    assert "complete -o default -F _txmq txmq" in script.stdout and '"dlq redrive")' in script.stdout
    # bash accepts it and completes a verb from it.
    check = subprocess.run(["bash", "-c", script.stdout + '\nCOMP_WORDS=(txmq dlq re); COMP_CWORD=2; _txmq; '
                                                         'echo "${COMPREPLY[@]}"'], capture_output=True, text=True)
    assert check.stdout.strip() == "redrive"


def test_a_consumer_of_a_missing_topic_gets_topic_not_found_and_creates_nothing(cluster, admin, unique_name):
    """The test cluster auto-creates topics: only a producer's first send may."""
    typo = unique_name("ordres")
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=unique_name("g"),
                             subscriptions={typo: "*"}, await_duration_seconds=0.2) as consumer:
        with pytest.raises(txmq.TopicNotFoundError):
            consumer.receive(1)
    assert typo not in {t.topic for t in admin.list_topics().topics}

    async def receive_async() -> None:
        from txmq.aio import AsyncSimpleConsumer

        async with AsyncSimpleConsumer(cluster.nameserver_address, consumer_group=unique_name("g"),
                                       subscriptions={typo: "*"}, await_duration_seconds=0.2) as consumer:
            await consumer.receive(1)
    with pytest.raises(txmq.TopicNotFoundError):
        asyncio.run(receive_async())
    assert typo not in {t.topic for t in admin.list_topics().topics}
    with txmq.Producer(cluster.nameserver_address) as producer:
        producer.send(txmq.Message(typo, b"first"))
    assert typo in {t.topic for t in admin.list_topics().topics}


def test_topic_delete_refuses_while_groups_read_it_unless_forced(cluster, admin, unique_name):
    topic, group, other = unique_name("old"), unique_name("reader"), unique_name("unread")
    admin.create_topic(topic, queue_count=2)
    admin.create_topic(other, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        producer.send(txmq.Message(topic, b"x"))
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as c:
        c.ack_many(wait_until(lambda: c.receive(16)))
    refused = cli(cluster, "topic", "delete", topic)
    assert refused.returncode == 1 and group in refused.stderr and "force" in refused.stderr
    assert topic in {t.topic for t in admin.list_topics().topics}
    deleted = cli_json(cluster, "topic", "delete", topic, "--force")
    assert deleted["brokers"] == ["broker-0"] and deleted["consumer_groups"] == [group]
    assert deleted["entries_deleted"] == 1
    assert topic not in {t.topic for t in admin.list_topics().topics}
    with pytest.raises(txmq.TopicNotFoundError):
        admin.describe_topic(topic)
    with pytest.raises(txmq.ConsumerGroupNotFoundError):
        admin.consumer_groups(group)
    # Nobody read it: deleted without force. Deleting it again: not found.
    assert cli_json(cluster, "topic", "delete", other)["brokers"] == ["broker-0"]
    again = cli(cluster, "topic", "delete", other)
    assert again.returncode == 1 and "does not exist" in again.stderr


def test_topic_delete_refuses_while_transactions_of_it_are_undecided(cluster, admin, unique_name):
    topic = unique_name("pending")

    class Unknown(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            return txmq.LocalTransactionState.UNKNOWN

        def check_local_transaction(self, message):
            return txmq.LocalTransactionState.UNKNOWN

    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("g"), listener=Unknown(),
                                  answer_checks=False) as producer:
        result = producer.send_in_transaction(txmq.Message(topic, b"undecided"))
    with pytest.raises(txmq.TopicInUseError, match="pending or discarded"):
        admin.delete_topic(topic, force=True)
    admin.resolve_transaction(result.transaction_id, "rollback", operator="test", reason="cleanup")
    assert admin.delete_topic(topic).brokers == ["broker-0"]
