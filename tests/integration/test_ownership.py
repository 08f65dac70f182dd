"""Authorize what an id names (issue 30), natively, on real processes with auth on: the
ownership census (tests/support/ownership.py) — every RPC taking a transaction id, a receipt
handle, a global transaction id or a check's transaction tried by a principal allowed on
resource A with ids of resource B, captured and forged — refuses them all and changes
nothing of B's; malformed handles are never INTERNAL/UNKNOWN. The holes the outside census
found are pinned by name below, each failing on the code before the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from tests.support.ownership import Census, Native, run_cluster_census, secured_cluster
from txmq.ids import TransactionId
from txmq.v1 import broker_pb2, common_pb2

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def census_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Census, list[str]]]:
    cluster = secured_cluster(tmp_path_factory.mktemp("ownership"))
    try:
        census = Census()
        changed = run_cluster_census(cluster, census, proxy=False)
        yield census, changed
    finally:
        cluster.stop()


def test_the_native_census_refuses_every_id_of_another_resource(census_run: tuple[Census, list[str]],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    census, changed = census_run
    with capsys.disabled():
        print("\n" + census.table())
    assert len(census.of("unauthorized")) >= 60
    assert not [a for a in census.of("unauthorized") if a.succeeded], census.table()
    assert not [a for a in census.of("malformed") if a.succeeded], census.table()
    assert changed == []


def named(census: Census, prefix: str) -> list[Any]:
    found = [a for a in census.attempts if a.name.startswith(prefix)]
    assert found, prefix
    return found


def test_another_groups_transaction_cannot_be_ended_even_naming_it(census_run: tuple[Census, list[str]]) -> None:
    """The broker skipped the group test when no producer group was named (the proxy's
    relay named none): now the transaction's recorded group is always what is authorized."""
    census, _ = census_run
    for a in named(census, "EndTransaction captured id naming"):
        assert a.outcome.startswith("PERMISSION_DENIED"), a
    # Naming its own group, which the policy table allows: refused for the id's group, which
    # the refusal does not name (alice holds no right on it: test_ownership_leaks.py).
    for a in named(census, "EndTransaction captured id naming ga"):
        assert "the producer_group of transaction id" in a.outcome and "'gb'" not in a.outcome, a


def test_minted_transaction_ids_are_invalid_before_any_lookup(census_run: tuple[Census, list[str]]) -> None:
    census, _ = census_run
    for a in named(census, "EndTransaction forged"):
        assert a.outcome.startswith(("INVALID_ARGUMENT", "PERMISSION_DENIED")), a
        if "naming ga" in a.name:  # allowed by the policy table: the id itself is refused
            assert a.outcome.startswith("INVALID_ARGUMENT") and "issued" in a.outcome, a


def test_change_invisible_duration_refuses_a_handle_of_another_topic(census_run: tuple[Census, list[str]]) -> None:
    """The census's hole 2 natively: the handle's topic was ignored."""
    census, _ = census_run
    (a,) = named(census, "ChangeInvisibleDuration captured tb handle naming ta")
    assert a.outcome.startswith("PERMISSION_DENIED") and "the topic of receipt handle" in a.outcome, a
    assert "'tb'" not in a.outcome, a
    (a,) = named(census, "ChangeInvisibleDuration captured tb handle naming no topic")
    assert a.outcome.startswith("PERMISSION_DENIED"), a


def test_a_non_utf8_receipt_handle_is_invalid_on_every_rpc_taking_one(census_run: tuple[Census, list[str]]) -> None:
    census, _ = census_run
    malformed = census.of("malformed")
    assert {a.name.split()[0] for a in malformed} == {"AckMessages", "ReceiveMessages", "ChangeInvisibleDuration",
                                                      "DeadLetterMessage"}
    for a in malformed:
        assert not a.succeeded and ("INVALID_ARGUMENT" in a.outcome or "refused per entry" in a.outcome), a


# ------------------------------------------------------------------- ids across a fail-over
def test_ids_survive_a_failover_and_forged_ones_are_refused_by_the_new_leader(tmp_path: Path) -> None:
    """The id secret is in the replicated store: the new leader accepts what the old one
    issued and refuses what it did not."""
    cluster = secured_cluster(tmp_path / "replicated", replication_factor=2, min_insync_replicas=1)
    try:
        census = Census()
        native = Native(cluster, census)
        cluster.create_topic("na", queue_count=1)
        sent = native.half("alice", "na", "ga")
        first = cluster.wait_leaders()["broker-0"]
        first.kill()
        second = cluster.wait_leaders(not_on=first)["broker-0"]
        stub = Native(cluster, census)
        assert stub.broker_address == second.address
        tid = TransactionId.decode(sent.transaction_id)
        forged = TransactionId(tid.broker, tid.store_id, tid.sequence + 1, tid.tag).encode()
        with pytest.raises(grpc.RpcError) as refused:
            stub.stub("alice").EndTransaction(broker_pb2.EndTransactionRequest(
                transaction_id=forged, producer_group="ga", resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT,
                source=common_pb2.TRANSACTION_SOURCE_CLIENT), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ended = stub.stub("alice").EndTransaction(broker_pb2.EndTransactionRequest(
            transaction_id=sent.transaction_id, producer_group="ga",
            resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT, source=common_pb2.TRANSACTION_SOURCE_CLIENT),
            timeout=10)
        assert ended.state == common_pb2.TRANSACTION_STATE_COMMITTED
        native.close()
        stub.close()
    finally:
        cluster.stop()
