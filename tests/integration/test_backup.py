"""Online backup and restore of a broker (``txmq broker backup`` / ``restore``) with real
processes: a backup taken while producers send is restored into a fresh broker, which then
delivers every message acknowledged before the backup began exactly once, none sent after
it ended, and still holds the pending transactions; and the refusals an operator meets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import txmq
from tests.support.cli import txmq_cli
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState


class Undecided(txmq.TransactionListener):
    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        return LocalState.UNKNOWN

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        return LocalState.UNKNOWN


def consume_all(cluster, topic: str, group: str, expect_at_least: int) -> list[str]:
    """Message ids of everything the topic delivers to a new group (acknowledged as read),
    read until ``expect_at_least`` arrived and then nothing more for a moment."""
    got: list[str] = []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.3) as consumer:
        quiet_since = [time.monotonic()]

        def drained() -> bool:
            batch = consumer.receive(max_messages=64, invisible_duration_seconds=30)
            for m in batch:
                got.append(m.message_id)
                consumer.ack(m)
            if batch:
                quiet_since[0] = time.monotonic()
            return len(got) >= expect_at_least and time.monotonic() - quiet_since[0] > 1.5
        wait_until(drained, timeout=60, interval=0.01, message=lambda: f"consumed {len(got)} of {expect_at_least}")
    return got


def test_backup_under_load_restores_into_a_fresh_broker(fresh_cluster_factory, unique_name, tmp_path: Path):
    source = fresh_cluster_factory(brokers=1)
    topic = unique_name("orders")
    source.create_topic(topic, queue_count=2)
    group = unique_name("pg")
    # Transactions left undecided before the backup: the restored broker must still hold them.
    with txmq.TransactionProducer(source.nameserver_address, producer_group=group, listener=Undecided()) as tp:
        undecided = [tp.send_in_transaction(txmq.Message(topic, f"pending-{i}".encode())) for i in range(3)]
    pending = {r.message_id for r in undecided}

    acked: list[tuple[str, float, float]] = []  # (message id, send started, acknowledged)
    stop = threading.Event()
    errors: list[BaseException] = []

    def load() -> None:
        try:
            with txmq.Producer(source.nameserver_address) as producer:
                i = 0
                while not stop.is_set() and i < 20000:
                    started = time.monotonic()
                    receipt = producer.send(txmq.Message(topic, f"m{i}".encode()))
                    acked.append((receipt.message_id, started, time.monotonic()))
                    i += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    wait_until(lambda: len(acked) >= 200, timeout=30, message="the load did not start")
    backup_dir = tmp_path / "backup"
    began = time.monotonic()
    out = txmq_cli(source, "broker", "backup", "broker-0", "--to", str(backup_dir))
    ended = time.monotonic()
    assert out.returncode == 0, out.stderr
    # The load went on during the backup, and for a while after it.
    wait_until(lambda: any(s > ended for _, s, _ in acked[-50:]) and len(acked) > 0, timeout=30)
    stop.set()
    worker.join(30)
    assert not errors, errors
    report = json.loads(out.stdout)
    manifest = json.loads((backup_dir / "MANIFEST.json").read_text())
    assert manifest["shard"] == report["shard"] == "broker-0"
    assert manifest["last_log_sequence"] >= 200 + 3
    assert {f["name"] for f in manifest["files"]} == set(os.listdir(backup_dir)) - {"MANIFEST.json"}
    assert any(f["name"].startswith("MANIFEST-") for f in manifest["files"])  # RocksDB's own manifest

    # A fresh cluster; restoring over its running broker is refused and changes nothing.
    target = fresh_cluster_factory(brokers=1)
    data_dir = target.brokers[0].env["TXMQ_DATA_DIR"]
    refused = txmq_cli(target, "broker", "restore", "--from", str(backup_dir), "--data-dir", data_dir, "--replace")
    assert refused.returncode == 1 and "running broker" in refused.stderr, refused
    assert target.brokers[0].running
    target.stop_broker(0)
    not_empty = txmq_cli(target, "broker", "restore", "--from", str(backup_dir), "--data-dir", data_dir)
    assert not_empty.returncode == 1 and "not empty" in not_empty.stderr, not_empty
    restored = txmq_cli(target, "broker", "restore", "--from", str(backup_dir), "--data-dir", data_dir, "--replace")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["last_log_sequence"] == manifest["last_log_sequence"]
    target.restart_broker(0)
    target.wait_route(topic, 2)

    before = {m for m, _, a in acked if a < began}
    after = {m for m, s, _ in acked if s > ended}
    assert before and after
    got = consume_all(target, topic, unique_name("cg"), expect_at_least=len(before))
    assert len(got) == len(set(got)), "a message was delivered twice"
    assert before <= set(got), f"{len(before - set(got))} acknowledged messages missing"
    assert not (after & set(got)), "messages sent after the backup ended came back"

    # The pending transactions are served: listed, and decided by an operator.
    listed = txmq_cli(target, "txn", "list", "--state", "pending", "--group", group)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["transactions"]
    assert {t["message_id"] for t in rows} == pending
    # Under a new store identity: the original's ids are refused, never taken for new ones.
    assert not {t["transaction_id"] for t in rows} & {r.transaction_id for r in undecided}
    old = txmq_cli(target, "txn", "describe", undecided[0].transaction_id)
    assert old.returncode == 1 and "earlier store" in old.stderr, old
    some = rows[0]["transaction_id"]
    resolved = txmq_cli(target, "txn", "resolve", some, "--commit", "--operator", "test", "--reason", "restored")
    assert resolved.returncode == 0, resolved.stderr
    assert len(consume_all(target, topic, unique_name("cg"), expect_at_least=len(got) + 1)) == len(got) + 1


def test_backup_and_restore_refusals(fresh_cluster_factory, tmp_path: Path):
    cluster = fresh_cluster_factory(brokers=1)
    unknown = txmq_cli(cluster, "broker", "backup", "no-such-shard", "--to", str(tmp_path / "b0"))
    assert unknown.returncode == 1 and "'no-such-shard' is not registered" in unknown.stderr
    assert not (tmp_path / "b0").exists()

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    unwritable = txmq_cli(cluster, "broker", "backup", "broker-0", "--to", str(blocker / "b1"))
    assert unwritable.returncode == 1 and "cannot create it" in unwritable.stderr, unwritable
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    not_empty = txmq_cli(cluster, "broker", "backup", "broker-0", "--to", str(tmp_path / "full"))
    assert not_empty.returncode == 1 and "not empty" in not_empty.stderr

    good = tmp_path / "b2"
    assert txmq_cli(cluster, "broker", "backup", "broker-0", "--to", str(good)).returncode == 0
    # A damaged copy is refused before anything is written.
    victim = max((p for p in good.iterdir() if p.name.endswith(".sst") or p.name.endswith(".log")),
                 key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    fresh = tmp_path / "restored"
    damaged = subprocess.run([sys.executable, "-m", "services.broker.restore", "--from", str(good),
                              "--data-dir", str(fresh)], capture_output=True, text=True, timeout=60)
    assert damaged.returncode == 1 and "sha256 differs" in damaged.stderr, damaged
    assert not fresh.exists()
    no_manifest = subprocess.run([sys.executable, "-m", "services.broker.restore", "--from", str(tmp_path / "full"),
                                  "--data-dir", str(fresh)], capture_output=True, text=True, timeout=60)
    assert no_manifest.returncode == 1 and "no MANIFEST.json" in no_manifest.stderr


def test_restore_without_the_services_prints_the_command(tmp_path):
    """Where the services are not installed, ``txmq broker restore`` says what to run there
    (and fails), importing nothing of them."""
    script = ("import sys; sys.modules['services'] = None\n"  # nothing named services can be found
              "from txmq._cli import main\n"
              f"sys.exit(main(['broker', 'restore', '--from', {str(tmp_path / 'b')!r}, '--data-dir', "
              f"{str(tmp_path / 'd')!r}, '--replace']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert f"python -m services.broker.restore --from {tmp_path / 'b'} --data-dir {tmp_path / 'd'} --replace" \
        in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()


def test_a_backup_is_readable_by_its_owner_only(fresh_cluster_factory, tmp_path: Path):
    """A backup holds every message of the shard and the store's id secret (what transaction
    ids and receipt handles are authenticated with): like the credential files, it is its
    owner's alone — a directory made for it 0700, every file 0600 — whatever the umask (the
    usual 022 left them readable by every user of the machine)."""
    cluster = fresh_cluster_factory(brokers=1)
    topic = "backup-modes"
    cluster.create_topic(topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        producer.send(txmq.Message(topic, b"secret"))
    backup_dir = tmp_path / "backup"
    previous = os.umask(0o022)
    try:
        out = txmq_cli(cluster, "broker", "backup", "broker-0", "--to", str(backup_dir))
    finally:
        os.umask(previous)
    assert out.returncode == 0, out.stderr
    assert backup_dir.stat().st_mode & 0o777 == 0o700, oct(backup_dir.stat().st_mode)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in backup_dir.iterdir()}
    assert "MANIFEST.json" in modes and set(modes.values()) == {"0o600"}, modes
