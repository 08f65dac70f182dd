"""The public surface of ``txmq`` and what the client refuses before any round trip.

No server is started: clients point at a closed port, so any call that reached the network
would fail with UnavailableError instead of the error under test.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

import txmq
from txmq import _errors

NOWHERE = "127.0.0.1:1"

EXPORTS = [
    "Admin", "ConsumerGroupNotFoundError", "ConsumersLiveError", "NotANameServerError", "TopicInUseError",
    "TopicTypeMismatchError", "Transaction",
    "AlreadyExistsError", "BrokerNotFoundError", "CancelledError", "CheckMessage",
    "ClientClosedError", "ConnectionLimitError", "ConsumeResult", "DeadlineExceededError", "DiskFullError",
    "FailedPreconditionError", "GlobalTransactionResult", "GroupNotEmptyError", "ProducerGroupNotFoundError", "ProducersLiveError", "TransactionsOpenError", "InProgress", "InternalError", "InvalidArgumentError",
    "InvalidFieldError", "InvalidIdError",
    "InvalidNameError", "LeadershipLostError", "LocalTransactionState", "Message", "MessageTooLargeError",
    "NoBrokerError", "NoLeaderError", "NotEnoughReplicasError", "NotFoundError", "NotLeaderError", "OverloadedError",
    "PermissionDeniedError", "PrincipalLimitError", "Producer",
    "PropertiesTooLargeError", "PushConsumer",
    "QueueNotFoundError", "QuotaExceededError", "ReceiptHandleNotFoundError", "ReceivedMessage",
    "ResourceExhaustedError", "RoutingStats", "SendReceipt", "ShardDrainingError", "ShardStats", "SimpleConsumer",
    "SqlFilter", "StaleClaimError", "SystemTopicError",
    "TLS", "TopicExistsError", "TopicNotFoundError", "TransactionListener", "TransactionMessage",
    "TransactionNotFoundError", "TransactionProducer", "TransactionResult", "TransactionState",
    "TransactionStateError", "TxmqError", "UnauthenticatedError", "UnavailableError", "UndecodableRequestError",
    "WrongBrokerError",
]
EXPORTS.sort()


class Listener(txmq.TransactionListener):
    def __init__(self) -> None:
        self.executed: list[object] = []

    def execute_local_transaction(self, message, arg):
        self.executed.append(message)
        return txmq.LocalTransactionState.COMMIT

    def check_local_transaction(self, message):
        return txmq.LocalTransactionState.COMMIT


# ------------------------------------------------------------------------- the surface

def test_export_list_is_pinned():
    assert sorted(txmq.__all__) == EXPORTS
    for name in txmq.__all__:
        assert getattr(txmq, name) is not None


def test_every_error_class_is_exported_and_is_the_same_class():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    defined = {c for c in [_errors.TxmqError, *subclasses(_errors.TxmqError)] if c.__module__ == _errors.__name__}
    for cls in defined:
        assert getattr(txmq, cls.__name__) is cls


def test_enums():
    assert [s.name for s in txmq.LocalTransactionState] == ["COMMIT", "ROLLBACK", "UNKNOWN"]
    assert [s.name for s in txmq.TransactionState] == ["PREPARED", "COMMITTED", "ROLLED_BACK", "DISCARDED"]
    assert [s.name for s in txmq.ConsumeResult] == ["SUCCESS", "FAILURE"]


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        txmq.Producer(NOWHERE, "group")  # type: ignore[misc]
    with pytest.raises(TypeError):
        txmq.TransactionProducer(NOWHERE, "group", Listener())  # type: ignore[misc]


# ------------------------------------------------------------------------- values

def test_message_normalises_and_is_immutable():
    props = {"a": "1"}
    m = txmq.Message("t", bytearray(b"body"), keys=["k1", "k2"], properties=props)
    props["b"] = "2"
    assert m.body == b"body" and isinstance(m.body, bytes)
    assert m.keys == ("k1", "k2")
    assert dict(m.properties) == {"a": "1"}
    assert txmq.Message("t", b"", keys="one").keys == ("one",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.topic = "other"  # type: ignore[misc]
    assert hash(m) == hash(txmq.Message("t", b"body", keys=("k1", "k2"), properties={"x": "y"}))


@pytest.mark.parametrize("kwargs, field", [
    ({"body": "text"}, "body"),
    ({"body": b"", "check_immunity_seconds": 0}, "check_immunity_seconds"),
    ({"body": b"", "check_immunity_seconds": -1.0}, "check_immunity_seconds"),
])
def test_message_refuses_bad_fields(kwargs, field):
    with pytest.raises(txmq.InvalidFieldError) as info:
        txmq.Message("t", **kwargs)
    assert info.value.field == field
    assert isinstance(info.value, txmq.TxmqError)


def test_transaction_message_reads_like_the_message():
    m = txmq.Message("t", b"b", tag="x", keys=("k",), properties={"p": "v"})
    view = txmq.TransactionMessage(m, "M1", "T1", "broker-0", 3)
    assert (view.topic, view.body, view.tag, view.keys, dict(view.properties)) == ("t", b"b", "x", ("k",), {"p": "v"})
    assert (view.message_id, view.transaction_id, view.broker_name, view.queue_id) == ("M1", "T1", "broker-0", 3)


def test_received_message_times_are_aware_datetimes():
    fields = {f.name for f in dataclasses.fields(txmq.ReceivedMessage)}
    assert {"topic", "original_topic", "body", "tag", "keys", "properties", "message_id",
            "transaction_id", "broker_name", "queue_id", "queue_offset", "delivery_attempt",
            "receipt_handle", "stored_at", "visible_at", "invisible_until"} <= fields
    from txmq._types import ms_to_datetime
    assert ms_to_datetime(1_000) == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)


# ------------------------------------------------------------------------- client-side validation

@pytest.mark.parametrize("topic, error", [
    ("%DLQ%group", txmq.SystemTopicError),
    ("%HALF%", txmq.SystemTopicError),
    ("", txmq.InvalidNameError),
    ("has space", txmq.InvalidNameError),
    ("x" * 128, txmq.InvalidNameError),
])
def test_send_refuses_topics_the_broker_refuses(topic, error):
    with txmq.Producer(NOWHERE) as producer:
        with pytest.raises(error) as info:
            producer.send(txmq.Message(topic, b"x"))
    assert info.value.code.name == "INVALID_ARGUMENT"


def test_send_refuses_a_body_above_the_client_limit():
    with txmq.Producer(NOWHERE) as producer:
        with pytest.raises(txmq.MessageTooLargeError) as info:
            producer.send(txmq.Message("t", b"x" * (4 * 1024 * 1024 + 1)))
    assert (info.value.size, info.value.limit) == (4 * 1024 * 1024 + 1, 4 * 1024 * 1024)
    with txmq.Producer(NOWHERE, max_body_bytes=10) as producer:
        with pytest.raises(txmq.MessageTooLargeError) as info:
            producer.send(txmq.Message("t", b"x" * 11))
    assert info.value.limit == 10


def test_send_without_a_reachable_name_server_is_unavailable():
    with txmq.Producer(NOWHERE, request_timeout_seconds=2.0) as producer:
        with pytest.raises(txmq.UnavailableError) as info:
            producer.send(txmq.Message("t", b"x"))
    assert info.value.retryable


def test_closed_producer_refuses_to_send():
    producer = txmq.Producer(NOWHERE)
    producer.close()
    producer.close()  # idempotent
    with pytest.raises(txmq.ClientClosedError):
        producer.send(txmq.Message("t", b"x"))


@pytest.mark.parametrize("kwargs, error", [
    ({"send_timeout_seconds": 0}, txmq.InvalidFieldError),
    ({"request_timeout_seconds": -1.0}, txmq.InvalidFieldError),
    ({"max_attempts": 0}, txmq.InvalidFieldError),
    ({"max_body_bytes": 0}, txmq.InvalidFieldError),
    ({"linger_seconds": -0.001}, txmq.InvalidFieldError),
    ({"linger_seconds": 2.0}, txmq.InvalidFieldError),
    ({"linger_seconds": "1ms"}, txmq.InvalidFieldError),
    ({"producer_group": "%DLQ%x"}, txmq.InvalidNameError),
])
def test_producer_options_are_checked(kwargs, error):
    with pytest.raises(error):
        txmq.Producer(NOWHERE, **kwargs)


def test_a_producers_linger_reaches_its_produce_streams():
    with txmq.Producer(NOWHERE, linger_seconds=0.0) as producer:
        assert producer._client.produce_stream("127.0.0.1:2")._linger_seconds == 0.0
    with txmq.Producer(NOWHERE) as producer:
        assert producer._client.produce_stream("127.0.0.1:2")._linger_seconds == txmq._produce_stream.LINGER_SECONDS


def test_name_server_list_is_required():
    with pytest.raises(txmq.InvalidFieldError):
        txmq.Producer("")
    with pytest.raises(txmq.InvalidFieldError):
        txmq.Producer([" "])


# ------------------------------------------------------------------------- transaction producer

def test_refused_half_message_does_not_run_the_local_transaction():
    listener = Listener()
    with txmq.TransactionProducer(NOWHERE, producer_group="pg", listener=listener) as producer:
        with pytest.raises(txmq.SystemTopicError):
            producer.send_in_transaction(txmq.Message("%DISCARD%pg", b"x"))
        with pytest.raises(txmq.MessageTooLargeError):
            producer.send_in_transaction(txmq.Message("t", b"x" * (4 * 1024 * 1024 + 1)))
        with pytest.raises(txmq.UnavailableError):  # no name server: the half message is not stored
            producer.send_in_transaction(txmq.Message("t", b"x"))
    assert listener.executed == []


@pytest.mark.parametrize("group", ["", "%DLQ%x", "bad name"])
def test_transaction_producer_needs_a_valid_group(group):
    with pytest.raises(txmq.InvalidNameError):
        txmq.TransactionProducer(NOWHERE, producer_group=group, listener=Listener())


def test_transaction_producer_needs_a_listener():
    with pytest.raises(txmq.InvalidFieldError):
        txmq.TransactionProducer(NOWHERE, producer_group="pg", listener=object())  # type: ignore[arg-type]


def test_transaction_listener_requires_both_methods():
    class OnlyExecute(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            return txmq.LocalTransactionState.COMMIT

    with pytest.raises(TypeError):
        OnlyExecute()  # type: ignore[abstract]


def test_transaction_producer_has_a_client_id():
    with txmq.TransactionProducer(NOWHERE, producer_group="pg", listener=Listener()) as a, \
            txmq.TransactionProducer(NOWHERE, producer_group="pg", listener=Listener()) as b:
        assert a.client_id and b.client_id and a.client_id != b.client_id
    with txmq.TransactionProducer(NOWHERE, producer_group="pg", listener=Listener(), client_id="me") as c:
        assert c.client_id == "me"


# ------------------------------------------------------------------------- consumers

@pytest.mark.parametrize("kwargs, error", [
    ({"consumer_group": "%DLQ%g", "subscriptions": {"t": "*"}}, txmq.InvalidNameError),
    ({"consumer_group": "g", "subscriptions": {}}, txmq.InvalidFieldError),
    ({"consumer_group": "g", "subscriptions": {"%HALF%": "*"}}, txmq.SystemTopicError),
    ({"consumer_group": "g", "subscriptions": {"t": 3}}, txmq.InvalidFieldError),
    ({"consumer_group": "g", "subscriptions": {"t": "*"}, "await_duration_seconds": 0}, txmq.InvalidFieldError),
])
def test_simple_consumer_options_are_checked(kwargs, error):
    with pytest.raises(error):
        txmq.SimpleConsumer(NOWHERE, **kwargs)


def test_dead_letter_topic_may_be_subscribed():
    with txmq.SimpleConsumer(NOWHERE, consumer_group="g", subscriptions={"%DLQ%other": "*", "t": ""}) as c:
        assert c.subscriptions == {"%DLQ%other": "*", "t": "*"}


def test_receive_arguments_are_checked():
    with txmq.SimpleConsumer(NOWHERE, consumer_group="g", subscriptions={"t": "*"}) as c:
        with pytest.raises(txmq.InvalidFieldError):
            c.receive(max_messages=0)
        with pytest.raises(txmq.InvalidFieldError):
            c.receive(invisible_duration_seconds=0)


@pytest.mark.parametrize("kwargs", [
    {"listener": "not callable"},
    {"listener": lambda m: txmq.ConsumeResult.SUCCESS, "consume_threads": 0},
    {"listener": lambda m: txmq.ConsumeResult.SUCCESS, "retry_backoff_seconds": 0},
])
def test_push_consumer_options_are_checked(kwargs):
    with pytest.raises(txmq.InvalidFieldError):
        txmq.PushConsumer(NOWHERE, consumer_group="g", subscriptions={"t": "*"}, **kwargs)


def test_push_consumer_starts_and_shuts_down_without_a_name_server():
    consumer = txmq.PushConsumer(NOWHERE, consumer_group="g", subscriptions={"t": "*"},
                                 listener=lambda m: txmq.ConsumeResult.SUCCESS)
    with consumer:
        pass
    with pytest.raises(txmq.ClientClosedError):
        consumer.start()


def test_examples_use_only_the_public_api():
    """The examples are what users copy: no private module (``txmq._x``), no raw stubs."""
    import re
    from pathlib import Path

    examples = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))
    assert examples
    for path in examples:
        text = path.read_text()
        assert not re.search(r"\btxmq\._|from txmq\.v1|_pb2", text), f"{path.name} reaches past the public API"


@pytest.mark.parametrize("name", ["errors", "ids", "names", "client", "faults", "routes", "tls", "auth", "checking",
                                  "sending", "tracing"])
def test_the_shared_kernel_has_public_homes(name):
    """Services, the pipeline and tools import ``txmq.errors``/``ids``/``names``/``client``
    (the same objects as the private modules), never an underscore module."""
    import importlib

    public = importlib.import_module(f"txmq.{name}")
    private = importlib.import_module(f"txmq._{name}")
    assert public.__all__
    for attr in public.__all__:
        assert getattr(public, attr) is getattr(private, attr), attr


def test_nothing_outside_the_sdk_imports_a_private_sdk_module():
    """The services, the pipeline, the benchmarks and the tools use the SDK's public modules
    (``txmq.errors``, ``txmq.faults``, ...), so the SDK may change its private ones freely.
    (The SDK's own unit tests may still reach its internals.)"""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for folder in ("services", "pipeline", "bench", "tools", "examples"):
        for path in sorted((root / folder).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"^\s*(from|import)\s+txmq\._", line):
                    offenders.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
