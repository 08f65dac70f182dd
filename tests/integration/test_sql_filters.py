"""SQL92 property filters on subscriptions, against real name server and broker processes:
the broker evaluates the expression in ReceiveMessages, so only matching messages cross the
network, and the messages it filters out are settled for that group (its lag reaches 0
without them ever being delivered); a malformed expression is refused with
INVALID_ARGUMENT naming the column; the SDK's ``txmq.SqlFilter`` reaches the same path.

The table sends each message once to a one-queue topic, then asks the broker once per
expression with a fresh consumer group and no long poll: a receive scans the queue from the
group's start to its end, so one call returns every match (the batch is larger than the
table)."""

from __future__ import annotations

import grpc
import pytest

import txmq
from tests.support.metrics import metric
from tests.support.waiting import wait_until
from txmq.v1 import broker_pb2, broker_pb2_grpc

# body → tag, properties (the "without" rows lack some or all of the properties)
MESSAGES = {
    b"m1": ("TagA", {"region": "eu", "amount": "150", "vip": "true"}),
    b"m2": ("TagB", {"region": "us", "amount": "50"}),
    b"m3": ("TagA", {"region": "eu"}),
    b"m4": ("", {"amount": "500"}),
    b"m5": ("TagC", {}),
    b"m6": ("", {"region": "apac", "amount": "abc"}),
}

# expression → the bodies it delivers (RocketMQ's semantics: NULL never matches)
TABLE = {
    "region = 'eu'": {b"m1", b"m3"},
    "region <> 'eu'": {b"m2", b"m6"},
    "amount > 100": {b"m1", b"m4"},  # m6's 'abc' does not convert: no match
    "amount <= 100": {b"m2"},
    "amount BETWEEN 50 AND 150": {b"m1", b"m2"},
    "amount NOT BETWEEN 50 AND 150": {b"m4"},
    "region IN ('eu', 'apac')": {b"m1", b"m3", b"m6"},
    "region NOT IN ('eu')": {b"m2", b"m6"},
    "region IS NULL": {b"m4", b"m5"},
    "amount IS NOT NULL": {b"m1", b"m2", b"m4", b"m6"},
    "NOT (region = 'eu')": {b"m2", b"m6"},
    "region = 'eu' AND amount > 100": {b"m1"},
    "region = 'eu' OR amount > 100": {b"m1", b"m3", b"m4"},
    "vip = TRUE": {b"m1"},
    "TAGS = 'TagA'": {b"m1", b"m3"},
    "TAGS IS NULL": {b"m4", b"m6"},
    "TAGS IN ('TagB', 'TagC') OR region STARTSWITH 'ap'": {b"m2", b"m5", b"m6"},
    "region CONTAINS 'u'": {b"m1", b"m2", b"m3"},
    "TRUE": set(MESSAGES),
    "FALSE": set(),
}


def _receive(stub, group: str, topic: str, expression: str, sql: bool = True) -> list:
    return list(stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
        consumer_group=group, topic=topic, queue_id=-1, filter_expression=expression,
        filter_type=broker_pb2.FILTER_TYPE_SQL92 if sql else broker_pb2.FILTER_TYPE_TAG,
        max_messages=64, invisible_duration_seconds=30.0), timeout=10).messages)


@pytest.fixture(scope="module")
def filtered_topic(cluster) -> str:
    topic = "sql-filters"
    cluster.create_topic(topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for body, (tag, props) in MESSAGES.items():
            producer.send(txmq.Message(topic, body, tag=tag, properties=props))
    return topic


@pytest.mark.parametrize("expression", list(TABLE))
def test_expression_table_on_the_broker(cluster, filtered_topic, unique_name, expression) -> None:
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[0].address))
    group = unique_name("sql")
    got = _receive(stub, group, filtered_topic, expression)
    assert sorted(m.message.body for m in got) == sorted(TABLE[expression])
    # Everything else was settled for the group, not left behind: once the deliveries are
    # acknowledged the group has nothing left, and nothing more comes.
    if got:
        acks = stub.AckMessages(broker_pb2.AckMessagesRequest(
            consumer_group=group, topic=filtered_topic, receipt_handles=[m.receipt_handle for m in got]),
            timeout=10)
        assert all(e.code == 0 for e in acks.entries)
    assert _receive(stub, group, filtered_topic, expression) == []
    port = cluster.brokers[0].metrics_port
    wait_until(lambda: metric(port, "txmq_consumer_lag_messages",
                              {"group": group, "topic": filtered_topic}) == 0,
               timeout=10, message="the group's lag to reach 0")


@pytest.mark.parametrize("expression,column", [
    ("amount >", 9), ("region = NULL", 10), ("amount > 'x'", 10), ("(region = 'eu'", 15),
    ("region @ 1", 8), ("amount BETWEEN 9 AND 1", 16),
])
def test_malformed_expression_is_refused_with_its_column(cluster, filtered_topic, unique_name,
                                                         expression, column) -> None:
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[0].address))
    group = unique_name("bad")
    with pytest.raises(grpc.RpcError) as info:
        _receive(stub, group, filtered_topic, expression)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"column {column}" in err.details() and "filter_expression" in err.details()
    # ... and changed nothing: the group starts from the beginning afterwards.
    assert len(_receive(stub, group, filtered_topic, "TRUE")) == len(MESSAGES)


def test_sql_text_as_a_tag_filter_is_still_a_tag_filter(cluster, filtered_topic, unique_name) -> None:
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[0].address))
    got = _receive(stub, unique_name("tag"), filtered_topic, "TagA", sql=False)
    assert sorted(m.message.body for m in got) == [b"m1", b"m3"]


def test_sdk_consumer_with_a_sql_filter(cluster, filtered_topic, unique_name) -> None:
    group = unique_name("sdk-sql")
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group,
                             subscriptions={filtered_topic: txmq.SqlFilter("region = 'eu' AND amount > 100")},
                             await_duration_seconds=1.0) as consumer:
        got = consumer.receive(max_messages=32)
        assert [m.body for m in got] == [b"m1"]
        assert got[0].properties["region"] == "eu"
        consumer.ack(got[0])
        assert consumer.receive(max_messages=32) == []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=unique_name("sdk-bad"),
                             subscriptions={filtered_topic: txmq.SqlFilter("region = ")},
                             await_duration_seconds=1.0) as consumer:
        with pytest.raises(txmq.InvalidFieldError, match="column 10"):
            consumer.receive()
