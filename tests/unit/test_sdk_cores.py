"""The SDK's cores other than sending and checks, without I/O: the client's (name server
failover, calls bound to a shard, brokers' addresses), the consumers' (targets, FIFO group
queues, a push listener's outcome and retry delay), the producers' (who answers a check,
explicit transactions, options) and the Admin API's (namespaces, failover). Each is driven
here step by step, as the sync and asyncio drivers do."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import txmq
import txmq.anchored
from txmq._administering import AdminCall, AdminRequests, AdminRpc, call_steps
from txmq._calling import (
    BOUND_ATTEMPTS,
    MAX_ENTRIES_PER_REQUEST,
    BoundCall,
    BrokerAddress,
    BrokerAddresses,
    NameServerCall,
    NameServers,
    QueueRoute,
    Wait,
    bound_steps,
)
from txmq._faults import FaultTable
from txmq._producing import Ask, ExplicitTransaction, OpenTransactions, check_transaction_options, who_answers
from txmq._receiving import DeferredAcks, GroupQueues, Routes, Target, ack_groups, consumed, retry_delay, target_steps
from txmq._sending import run
from txmq.v1 import admin_pb2, nameserver_pb2

UNAVAILABLE = txmq.UnavailableError("down")


def drive(steps: Any, perform: Callable[[Any], Any]) -> tuple[Any, list[Any]]:
    """Runs ``steps`` with ``perform``, recording every step."""
    seen: list[Any] = []

    def record(step: Any) -> Any:
        seen.append(step)
        return perform(step)

    return run(steps, record), seen


# --- the client ---------------------------------------------------------------------------

def test_name_servers_fail_over_on_transient_errors_and_stay_on_the_one_that_answered():
    servers = NameServers("a:1,b:1,c:1")
    servers._index = 0  # the start is random; fixed here
    answers = {"a:1": UNAVAILABLE, "b:1": "from b", "c:1": "from c"}

    def perform(step: NameServerCall) -> Any:
        answer = answers[step.address]
        if isinstance(answer, Exception):
            raise answer
        return answer

    result, seen = drive(servers.steps("ListBrokers", "req"), perform)
    assert result == "from b" and [s.address for s in seen] == ["a:1", "b:1"]
    result, seen = drive(servers.steps("ListBrokers", "req"), perform)
    assert [s.address for s in seen] == ["b:1"]  # the last one that answered goes first
    answers["b:1"] = txmq.TopicNotFoundError("t")  # not transient: the answer
    with pytest.raises(txmq.TopicNotFoundError):
        drive(servers.steps("QueryRoute", "req"), perform)
    answers.update({"a:1": UNAVAILABLE, "b:1": UNAVAILABLE, "c:1": UNAVAILABLE})
    with pytest.raises(txmq.UnavailableError):
        drive(servers.steps("QueryRoute", "req"), perform)


def test_a_bound_call_retries_on_its_shard_asking_the_address_again_then_gives_up():
    faults = FaultTable()
    calls: list[str] = []

    def perform(step: Any) -> Any:
        if type(step) is BrokerAddress:
            return "addr-refreshed" if step.refresh else "addr"
        if type(step) is Wait:
            return None
        assert type(step) is BoundCall
        calls.append(step.address)
        if len(calls) < 2:
            raise UNAVAILABLE
        return "acked"

    result, seen = drive(bound_steps(faults, "broker-0"), perform)
    assert result == "acked" and calls == ["addr", "addr-refreshed"]
    assert [type(s).__name__ for s in seen] == ["BrokerAddress", "BoundCall", "Wait", "BrokerAddress", "BoundCall"]
    calls.clear()

    def failing(step: Any) -> Any:
        if type(step) is BoundCall:
            calls.append(step.address)
            raise UNAVAILABLE
        return None if type(step) is Wait else "addr"

    with pytest.raises(txmq.UnavailableError):
        drive(bound_steps(faults, "broker-0"), failing)
    shard = next(s for s in faults.stats().shards if s.shard == "broker-0")
    assert len(calls) == BOUND_ATTEMPTS and shard.failures >= BOUND_ATTEMPTS

    def refused(step: Any) -> Any:
        if type(step) is BoundCall:
            raise txmq.ReceiptHandleNotFoundError("h")
        return "addr"

    with pytest.raises(txmq.ReceiptHandleNotFoundError):  # not retried
        drive(bound_steps(faults, "broker-0"), refused)


def test_broker_addresses_are_learnt_from_routes_and_forgotten_when_unlisted():
    addresses = BrokerAddresses()
    addresses.learn([QueueRoute("broker-0", "h0:1", 0), QueueRoute("broker-1", "h1:1", 0)])
    assert addresses.get("broker-1") == "h1:1"
    listed = nameserver_pb2.ListBrokersResponse(brokers=[nameserver_pb2.BrokerInfo(name="broker-0", address="h0:2")])
    assert addresses.listed(listed, "broker-0") == "h0:2"
    with pytest.raises(txmq.BrokerNotFoundError):
        addresses.listed(listed, "broker-1")
    assert addresses.get("broker-1") is None


# --- consumers ----------------------------------------------------------------------------

def test_targets_skip_topics_without_a_route_and_raise_only_when_none_has_one():
    subscriptions: dict[str, Any] = {"a": "*", "b": txmq.SqlFilter("x > 1"), "c": "*"}
    routes = {"a": (QueueRoute("broker-0", "h", 0), QueueRoute("broker-0", "h", 1), QueueRoute("broker-1", "h", 0)),
              "b": txmq.TopicNotFoundError("b"), "c": txmq.NoLeaderError("c", ["broker-2"])}

    def perform(step: Routes) -> Any:
        found = routes[step.topic]
        if isinstance(found, Exception):
            raise found
        return found

    targets, _ = drive(target_steps(subscriptions), perform)
    assert targets == [Target("a", "*", "broker-0"), Target("a", "*", "broker-1")]
    del subscriptions["a"]
    with pytest.raises(txmq.NoLeaderError):  # between leaders (retryable) is raised first
        drive(target_steps(subscriptions), perform)
    assert drive(target_steps(subscriptions, lenient=True), perform)[0] == []


def received(group: str = "", attempt: int = 1, invisible_in: float = 30.0) -> txmq.ReceivedMessage:
    now = dt.datetime.now(dt.UTC)
    return txmq.ReceivedMessage(topic="t", body=b"", tag="", keys=(), properties={}, message_id=f"M{id(now)}",
                                transaction_id="", broker_name="broker-0", queue_id=0, queue_offset=0,
                                delivery_attempt=attempt, receipt_handle="h", stored_at=now, visible_at=now,
                                invisible_until=now + dt.timedelta(seconds=invisible_in), original_topic="t",
                                message_group=group)


def test_a_message_group_runs_one_message_at_a_time_in_order():
    groups = GroupQueues()
    first, second, third, other = received("g"), received("g"), received("g", invisible_in=1.0), received("h")
    assert groups.admit(first) and not groups.admit(second) and not groups.admit(third) and groups.admit(other)
    assert groups.admit(received())  # no group: at once
    assert [m for _, m in groups.due(dt.datetime.now(dt.UTC).timestamp() + 5)] == [third]
    renewed = received("g")
    assert groups.renewed("g", third, renewed) is False  # replaced: still waiting
    assert groups.renewed("g", second, None) is True     # its handle was gone: dropped
    assert groups.renewed("g", third, None) is False     # not waiting any more (replaced)
    assert groups.next("g") is renewed and groups.next("g") is None
    assert groups.admit(received("g"))                   # the group was idle: runs at once again


def test_a_push_listeners_outcome_and_the_retry_delay():
    m = received(attempt=3)
    assert consumed("c", m, txmq.ConsumeResult.SUCCESS) is txmq.ConsumeResult.SUCCESS
    for result in (txmq.ConsumeResult.FAILURE, None, "yes"):
        assert consumed("c", m, result) is txmq.ConsumeResult.FAILURE
    assert consumed("c", m, txmq.ConsumeResult.SUCCESS, RuntimeError("raised")) is txmq.ConsumeResult.FAILURE
    assert retry_delay(m, 1.0, 60.0) == 4.0 and retry_delay(m, 1.0, 3.0) == 3.0
    assert retry_delay(received(attempt=1), 0.5, 60.0) == 0.5


# --- producers ----------------------------------------------------------------------------

class _Producer:
    def __init__(self, anchored: bool = False) -> None:
        self._abandoned = {"M-orphan"}
        self._open = OpenTransactions()
        self.open_transaction_retry_seconds = 2.0
        self._decision_store = object() if anchored else None


def half(message_id: str, properties: dict[str, str] | None = None) -> txmq.TransactionMessage:
    return txmq.TransactionMessage(message=txmq.Message("t", b"", properties=properties or {}),
                                   message_id=message_id, transaction_id="T", broker_name="broker-0", queue_id=0)


def test_who_answers_a_check():
    producer = _Producer()
    producer._open.add("M-open")
    assert who_answers(producer, half("M-orphan"), True) is txmq.LocalTransactionState.ROLLBACK
    assert who_answers(producer, half("M-open"), True) == txmq.InProgress(retry_after_seconds=2.0)
    assert who_answers(producer, half("M"), True) is Ask.CHECKER
    assert who_answers(producer, half("M"), False) is txmq.LocalTransactionState.UNKNOWN
    anchored = _Producer(anchored=True)
    marked = half("M", {txmq.anchored.ANCHOR_PROPERTY: "decisions"})
    assert who_answers(anchored, marked, False) is Ask.DECISIONS
    producer._open.discard("M-open")
    assert who_answers(producer, half("M-open"), True) is Ask.CHECKER


def test_an_explicit_transaction_ends_once_and_its_block_decides():
    tx = ExplicitTransaction("k")
    assert tx.on_exit(failed=False) is txmq.LocalTransactionState.COMMIT
    assert tx.on_exit(failed=True) is txmq.LocalTransactionState.ROLLBACK
    tx.halves.append((half("M1"), QueueRoute("broker-0", "h", 0)))
    assert [h.message_id for h, _ in tx.end(txmq.LocalTransactionState.COMMIT)] == ["M1"]
    assert tx.on_exit(failed=True) is None  # ended inside the block: nothing more
    with pytest.raises(txmq.TransactionStateError):
        tx.end(txmq.LocalTransactionState.ROLLBACK)


@pytest.mark.parametrize("options, field", [
    ({"listener": None, "checker": None, "decisions": None}, "listener"),
    ({"decisions": "dsn"}, "decisions"),
    ({"listener": object()}, "listener"),
    ({"checker": "no"}, "checker"),
    ({"workers": 0}, "check_threads"),
    ({"workers": True}, "check_threads"),
    ({"checker_refresh_seconds": 0}, "checker_refresh_seconds"),
    ({"client_id": "x" * 256}, "client_id"),
])
def test_transaction_producer_options_name_the_field_they_refuse(options, field):
    base: dict[str, Any] = dict(namespace="", producer_group="g", listener=None, checker=lambda m: None,
                                decisions=None, client_id=None, checker_refresh_seconds=1.0,
                                workers_name="check_threads", workers=2, listener_method_ok=callable,
                                listener_problem=lambda m: f"has no method {m}()")
    with pytest.raises(txmq.InvalidFieldError) as refused:
        check_transaction_options(**{**base, **options})
    assert refused.value.field == field


# --- the Admin API ------------------------------------------------------------------------

def test_admin_calls_apply_the_namespace_and_keep_listings_to_it():
    requests = AdminRequests("teamA")
    call = requests.create_topic("orders", queue_count=4, fifo=True)
    assert (call.service, call.method, call.request.topic, call.request.queue_count) == (
        "admin", "CreateTopic", "teamA%orders", 4)
    listing = requests.list_topics()
    response = admin_pb2.ListTopicsResponse(topics=[admin_pb2.TopicInfo(topic="teamA%orders"),
                                                    admin_pb2.TopicInfo(topic="teamB%orders")])
    assert [t.topic for t in listing.finish(response).topics] == ["orders"]
    with pytest.raises(txmq.InvalidFieldError):
        requests.resolve_transaction("T", "maybe", operator="o", reason="r")
    with pytest.raises(txmq.InvalidFieldError):
        requests.redrive_dead_letters("cg")  # neither ids nor all


def test_admin_calls_fail_over_between_name_servers():
    def perform(rpc: AdminRpc) -> Any:
        if rpc.address == "a:1":
            raise UNAVAILABLE
        if rpc.address == "b:1":
            raise txmq.NotANameServerError(rpc.address, "txmq.v1.AdminService/ListTopics")
        return "ok"

    assert drive(call_steps(["a:1", "c:1"], AdminCall("admin", "ListTopics", None)), perform)[0] == "ok"
    with pytest.raises(txmq.NotANameServerError):  # not transient: the answer
        drive(call_steps(["a:1", "b:1", "c:1"], AdminCall("admin", "ListTopics", None)), perform)


def _deliveries(n: int, broker_name: str, topic: str) -> list[Any]:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    return [SimpleNamespace(topic=topic, message_id=f"m{i}", receipt_handle=f"h{i}", broker_name=broker_name,
                            invisible_until=later) for i in range(n)]


def test_acks_go_in_requests_of_at_most_the_brokers_limit_per_broker_and_topic():
    """A broker refuses an AckMessages of more than MAX_ENTRIES_PER_REQUEST handles: the SDK's
    ack_many of 2,500 deliveries of one broker and topic is three requests, in order."""
    limit = MAX_ENTRIES_PER_REQUEST
    a, b = _deliveries(2 * limit + 452, "b1", "t"), _deliveries(3, "b2", "t")
    messages = [b[0], *a[:10], b[1], *a[10:], b[2]]
    batches = ack_groups(messages)
    assert [(broker, topic, len(indexes)) for broker, topic, indexes in batches] == [
        ("b2", "t", 3), ("b1", "t", limit), ("b1", "t", limit), ("b1", "t", 452)]
    assert sorted(i for _, _, indexes in batches for i in indexes) == list(range(len(messages)))
    assert [messages[i].message_id for _, _, indexes in batches[1:] for i in indexes] == [m.message_id for m in a]


def test_a_receive_carries_at_most_the_limit_of_deferred_acks_and_leaves_the_rest_queued():
    deferred = DeferredAcks(1.0)
    for message in _deliveries(MAX_ENTRIES_PER_REQUEST + 5, "b1", "t"):
        deferred.add(message)
    carried = deferred.take("b1", "t")
    assert [m.message_id for m in carried] == [f"m{i}" for i in range(MAX_ENTRIES_PER_REQUEST)]
    assert len(deferred) == 5 and deferred.next_due() is not None
    assert [m.message_id for m in deferred.take("b1", "t")] == [f"m{i}" for i in range(MAX_ENTRIES_PER_REQUEST,
                                                                                       MAX_ENTRIES_PER_REQUEST + 5)]
    assert len(deferred) == 0 and deferred.next_due() is None
