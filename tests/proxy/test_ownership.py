"""Authorize what an id names through the RocketMQ proxy (issue 30): the proxy acts for the
client's principal (``x-txmq-on-behalf-of``) and names its producer group, so the brokers
decide a proxied EndTransaction, ChangeInvisibleDuration, Ack or dead-lettering against what
the id names in their stores, as for a native call. The census's RocketMQ side (signed
requests of principals allowed on resource A with ids of resource B, captured and forged)
must be refused in band (FORBIDDEN, INVALID_TRANSACTION_ID, INVALID_RECEIPT_HANDLE) and
change nothing; malformed handles are never 50000/50001. Each hole the outside census found
is pinned by name."""

from __future__ import annotations

from typing import Iterator

import pytest

from services.proxy.protocol import Code
from tests.support.ownership import Census, run_cluster_census, secured_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def census_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Census, list[str]]]:
    cluster = secured_cluster(tmp_path_factory.mktemp("proxy-ownership"))
    try:
        census = Census()
        changed = run_cluster_census(cluster, census, proxy=True)
        yield census, changed
    finally:
        cluster.stop()


def rmq(census: Census, prefix: str) -> list:
    found = [a for a in census.attempts if a.name.startswith("rmq " + prefix)]
    assert found, prefix
    return found


def test_the_proxy_census_refuses_every_id_of_another_resource(census_run: tuple[Census, list[str]],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    census, changed = census_run
    with capsys.disabled():
        print("\n" + census.table())
    proxied = [a for a in census.attempts if a.name.startswith("rmq ")]
    assert len([a for a in proxied if a.kind == "unauthorized"]) >= 25
    assert not [a for a in census.attempts if a.succeeded], census.table()
    assert changed == []


def test_end_transaction_of_another_groups_transaction_is_forbidden(census_run: tuple[Census, list[str]]) -> None:
    """The census's hole 1: `check` on ra let a client end rb's and native gb's transactions
    (captured ids), and forged ones, client or server-check source alike."""
    census, _ = census_run
    for a in rmq(census, "EndTransaction captured"):
        assert a.outcome == f"in band {Code.FORBIDDEN}", a
    for a in rmq(census, "EndTransaction forged"):
        assert a.outcome in (f"in band {Code.INVALID_TRANSACTION_ID}", f"in band {Code.FORBIDDEN}"), a
    (own,) = rmq(census, "EndTransaction own id naming topic rb")
    assert own.outcome == f"in band {Code.FORBIDDEN}"


def test_change_invisible_duration_on_another_topic_is_forbidden(census_run: tuple[Census, list[str]]) -> None:
    """The census's hole 2 through the proxy: a handle of tb named as ta."""
    census, _ = census_run
    (a,) = rmq(census, "ChangeInvisibleDuration captured tb handle naming ta")
    assert a.outcome == f"in band {Code.FORBIDDEN}", a
    for a in rmq(census, "ChangeInvisibleDuration forged"):
        assert a.outcome == f"in band {Code.INVALID_RECEIPT_HANDLE}", a


def test_a_non_utf8_receipt_handle_is_an_invalid_handle_in_band(census_run: tuple[Census, list[str]]) -> None:
    """The census's 50001s: AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue."""
    census, _ = census_run
    for name in ("ChangeInvisibleDuration", "AckMessage", "ForwardMessageToDeadLetterQueue"):
        (a,) = rmq(census, f"{name} non-UTF-8 handle")
        assert a.outcome == f"in band {Code.INVALID_RECEIPT_HANDLE}", a
