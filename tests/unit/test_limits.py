"""services/common/limits.py: number checks of requests, guarded deserializers, the
rate-limited warning, admission and limits per connection and per principal (pure, no server)."""

from __future__ import annotations

import logging
import math

import pytest
from google.protobuf import duration_pb2

from services.common.auth import CALLER, ON_BEHALF_OF_HEADER, Caller
from services.common.auth.store import Principal
from services.common.limits import (ENTRY_LIMITS, Admission, CallerLimit, ConnectionLimit, PrincipalLimit,
                                    PrincipalShares, RateLimitedWarning, Refused, check_entries, check_numbers,
                                    guard_deserializer)
from txmq.errors import (ConnectionLimitError, InvalidFieldError, OverloadedError, PrincipalLimitError,
                         UndecodableRequestError)
from txmq.faults import OVERLOAD_RETRIES, OverloadBackoff, RetryAction, overload_backoff_seconds, retry_action
from txmq.client import MAX_ENTRIES_PER_REQUEST
from txmq.v1 import broker_pb2, checker_pb2, common_pb2


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.5, 366 * 86400.0 + 1])
def test_a_seconds_field_must_be_finite_and_in_range(value: float) -> None:
    with pytest.raises(InvalidFieldError) as refused:
        check_numbers(broker_pb2.QueryTransactionsRequest(older_than_seconds=value))
    assert refused.value.field == "older_than_seconds"


def test_nested_and_repeated_numbers_are_named_by_their_path() -> None:
    nested = broker_pb2.ProduceRequest(entries=[
        broker_pb2.ProduceEntry(),
        broker_pb2.ProduceEntry(send_message=broker_pb2.SendMessageRequest(
            message=common_pb2.Message(check_immunity_seconds=math.inf)))])
    with pytest.raises(InvalidFieldError) as refused:
        check_numbers(nested)
    assert refused.value.field == "entries[1].send_message.message.check_immunity_seconds"
    answer = checker_pb2.CheckTransactionStateRequest(answer=checker_pb2.CheckAnswer(retry_after_seconds=math.nan))
    with pytest.raises(InvalidFieldError, match="answer.retry_after_seconds"):
        check_numbers(answer)


def test_a_duration_outside_its_range_is_refused() -> None:
    service_pb2 = pytest.importorskip("services.proxy.protocol").service_pb2  # make proxy-deps
    request = service_pb2.ReceiveMessageRequest(long_polling_timeout=duration_pb2.Duration(seconds=2**62))
    with pytest.raises(InvalidFieldError, match="long_polling_timeout"):
        check_numbers(request)
    check_numbers(service_pb2.ReceiveMessageRequest(long_polling_timeout=duration_pb2.Duration(seconds=20)))


def test_sane_requests_pass() -> None:
    check_numbers(broker_pb2.QueryTransactionsRequest(older_than_seconds=60, limit=10))
    check_numbers(broker_pb2.ReceiveMessagesRequest(invisible_duration_seconds=0.05, long_polling_timeout_seconds=20))


def test_guarded_deserializers_refuse_without_raising_for_unary_and_raise_for_streams() -> None:
    unary = guard_deserializer(broker_pb2.SendMessageRequest.FromString, "SendMessage", streaming=False)
    refused = unary(b"\xff\xff\xff")
    assert isinstance(refused, Refused) and isinstance(refused.error, UndecodableRequestError)
    bad_number = unary(broker_pb2.SendMessageRequest(message=common_pb2.Message(
        check_immunity_seconds=math.nan)).SerializeToString())
    assert isinstance(bad_number, Refused) and isinstance(bad_number.error, InvalidFieldError)
    good = broker_pb2.SendMessageRequest(message=common_pb2.Message(topic="t"))
    assert unary(good.SerializeToString()) == good
    stream = guard_deserializer(broker_pb2.ProduceRequest.FromString, "Produce", streaming=True)
    with pytest.raises(UndecodableRequestError, match="Produce: the request body does not decode"):
        stream(b"\xff\xff\xff")


@pytest.mark.parametrize("request_at_limit, field", [
    (lambda n: broker_pb2.AckMessagesRequest(receipt_handles=["h"] * n), "receipt_handles"),
    (lambda n: broker_pb2.ReceiveMessagesRequest(ack_receipt_handles=["h"] * n), "ack_receipt_handles"),
    (lambda n: broker_pb2.ProduceRequest(entries=[broker_pb2.ProduceEntry()] * n), "entries"),
])
def test_lists_of_ids_and_entries_are_refused_beyond_the_limit_naming_the_field(request_at_limit, field) -> None:
    check_entries(request_at_limit(MAX_ENTRIES_PER_REQUEST))
    with pytest.raises(InvalidFieldError) as refused:
        check_entries(request_at_limit(MAX_ENTRIES_PER_REQUEST + 1))
    assert refused.value.field == field
    assert f"at most {MAX_ENTRIES_PER_REQUEST} entries per request, got {MAX_ENTRIES_PER_REQUEST + 1}" in str(refused.value)


def test_a_check_streams_groups_are_bounded_by_the_checkers_largest_setting() -> None:
    limit = dict(ENTRY_LIMITS["txmq.v1.CheckTransactionStateRequest"])[("subscribe", "producer_groups")]
    over = checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(producer_groups=["g"] * (limit + 1)))
    with pytest.raises(InvalidFieldError, match="subscribe.producer_groups"):
        check_entries(over)
    check_entries(checker_pb2.CheckTransactionStateRequest(answer=checker_pb2.CheckAnswer()))  # no subscribe


def test_a_guarded_deserializer_refuses_a_long_list_before_anything_reads_it() -> None:
    unary = guard_deserializer(broker_pb2.AckMessagesRequest.FromString, "AckMessages", streaming=False)
    body = broker_pb2.AckMessagesRequest(receipt_handles=["h"] * (MAX_ENTRIES_PER_REQUEST + 1)).SerializeToString()
    refused = unary(body)
    assert isinstance(refused, Refused) and refused.error.field == "receipt_handles"
    stream = guard_deserializer(broker_pb2.ProduceRequest.FromString, "Produce", streaming=True)
    with pytest.raises(InvalidFieldError, match="entries"):
        stream(broker_pb2.ProduceRequest(entries=[broker_pb2.ProduceEntry()] * (MAX_ENTRIES_PER_REQUEST + 1))
               .SerializeToString())


def test_the_warning_is_rate_limited_per_key_and_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    warning = RateLimitedWarning(logging.getLogger("test.limits"), interval_seconds=0.05)
    with caplog.at_level(logging.WARNING, "test.limits"):
        assert warning.warn("a", "first")
        assert not any(warning.warn("a", "again") for _ in range(10))
        assert warning.warn("b", "other key")
        import time
        time.sleep(0.06)
        assert warning.warn("a", "later")
    assert [r.getMessage() for r in caplog.records] == [
        "first", "other key", "later (10 more like it in the last 0.05 s not logged)"]


def test_admission_sheds_beyond_its_limit_with_a_retryable_error() -> None:
    admission = Admission(2)
    admission.enter()
    admission.enter()
    with pytest.raises(OverloadedError) as shed:
        admission.enter()
    assert shed.value.retryable and "max_concurrent_rpcs=2" in shed.value.message
    # Nothing was applied: the same request goes to the same shard again, after a backoff.
    assert retry_action(shed.value, bound=False) is RetryAction.SAME_SHARD
    assert 0.025 <= overload_backoff_seconds(1) <= 0.075 and overload_backoff_seconds(20) <= 3.0
    backoff = OverloadBackoff()
    pauses = [backoff.delay(shed.value) for _ in range(OVERLOAD_RETRIES + 1)]
    assert all(p is not None for p in pauses[:-1]) and pauses[-1] is None  # then the caller's own rules
    assert OverloadBackoff().delay(ConnectionLimitError("max_streams_per_connection", 1, 1)) is None
    admission.exit()
    admission.enter()
    assert admission.shed == 1


def test_connection_limits_are_per_connection_and_given_back() -> None:
    limit = ConnectionLimit("max_long_polls_per_connection", 2)
    with limit.hold("ipv4:10.0.0.1:1000"), limit.hold("ipv4:10.0.0.1:1000"):
        with pytest.raises(ConnectionLimitError, match="max_long_polls_per_connection=2"):
            limit.take("ipv4:10.0.0.1:1000")
        limit.take("ipv4:10.0.0.1:1001")  # another connection
    assert limit.held == {"ipv4:10.0.0.1:1001": 1}
    with pytest.raises(ConnectionLimitError):
        limit.take("ipv4:10.0.0.2:5", 3)


def test_a_timestamp_outside_its_range_is_refused() -> None:
    protocol = pytest.importorskip("services.proxy.protocol")  # make proxy-deps
    from google.protobuf import timestamp_pb2
    message = protocol.definition_pb2.Message(system_properties=protocol.definition_pb2.SystemProperties(
        born_timestamp=timestamp_pb2.Timestamp(seconds=2**62)))
    request = protocol.service_pb2.SendMessageRequest(messages=[message])
    with pytest.raises(InvalidFieldError, match=r"messages\[0\].system_properties.born_timestamp"):
        check_numbers(request)


def test_a_delivery_timestamp_in_milliseconds_is_the_official_clients_and_passes() -> None:
    """The official Python client writes a delay message's delivery time in ms into the
    seconds field; the proxy reads it as ms, so the check lets that field (only) through."""
    protocol = pytest.importorskip("services.proxy.protocol")  # make proxy-deps
    from google.protobuf import timestamp_pb2
    ms = timestamp_pb2.Timestamp(seconds=1_795_556_463_921)
    sp = protocol.definition_pb2.SystemProperties
    delayed = protocol.definition_pb2.Message(system_properties=sp(delivery_timestamp=ms))
    check_numbers(protocol.service_pb2.SendMessageRequest(messages=[delayed]))
    born = protocol.definition_pb2.Message(system_properties=sp(born_timestamp=ms))
    with pytest.raises(InvalidFieldError, match=r"born_timestamp"):
        check_numbers(protocol.service_pb2.SendMessageRequest(messages=[born]))
    too_far = protocol.definition_pb2.Message(system_properties=sp(
        delivery_timestamp=timestamp_pb2.Timestamp(seconds=2**62)))
    with pytest.raises(InvalidFieldError, match=r"delivery_timestamp"):
        check_numbers(protocol.service_pb2.SendMessageRequest(messages=[too_far]))


def test_a_gzip_body_is_inflated_only_up_to_the_limit() -> None:
    convert = pytest.importorskip("services.proxy.convert")  # make proxy-deps
    import zlib
    bomb = zlib.compress(b"\0" * (64 << 20), 9)  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < 100_000
    assert len(convert.inflate(bomb, 1000)) == 1001  # stopped one byte past the limit
    assert convert.inflate(zlib.compress(b"hello"), 1000) == b"hello"


# --- per principal ---------------------------------------------------------------------------

class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


class _Context:
    """What the limits read of a servicer context: its peer and its metadata."""

    def __init__(self, peer: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._peer = peer
        self._metadata = metadata

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def _as(name: str, service: bool = False) -> Caller:
    return Caller(Principal(name, service=service), store=None, credentials=object())  # type: ignore[arg-type]


def test_a_principal_limit_counts_every_connection_together_names_the_setting_and_counts_refusals() -> None:
    refused = _Counter()
    limit = PrincipalLimit("max_streams_per_principal", 2, refused)
    limit.take("alice")
    limit.take("alice")
    limit.take("bob")
    with pytest.raises(PrincipalLimitError, match="max_streams_per_principal=2") as caught:
        limit.take("alice")
    error = caught.value
    assert (error.reason, error.principal, error.held, error.limit, error.retryable) == \
        ("PRINCIPAL_LIMIT", "alice", 2, 2, False)
    assert refused.value == 1 and limit.held == {"alice": 2, "bob": 1}
    limit.give_back("alice")
    limit.take("alice")  # given back: room again


def test_a_principals_unary_share_is_refused_as_a_retryable_overload_naming_it() -> None:
    share = PrincipalLimit("max_concurrent_rpcs_per_principal", 1, fair_share=True)
    share.take("alice")
    with pytest.raises(OverloadedError) as caught:
        share.take("alice")
    assert caught.value.retryable and caught.value.principal == "alice"
    assert "principal 'alice' has max_concurrent_rpcs_per_principal=1 calls in flight" in caught.value.message
    assert OverloadBackoff().delay(caught.value) is not None  # the SDK backs off and retries it


def test_a_caller_limit_counts_the_connection_and_the_principal_and_holds_nothing_after_a_refusal() -> None:
    limit = CallerLimit(ConnectionLimit("max_long_polls_per_connection", 10),
                        PrincipalLimit("max_long_polls_per_principal", 3))
    token = CALLER.set(_as("alice"))
    try:
        held = [limit.take(_Context(f"ipv4:10.0.0.1:{port}")) for port in (1, 2, 3)]  # three connections
        with pytest.raises(PrincipalLimitError, match="max_long_polls_per_principal=3"):
            limit.take(_Context("ipv4:10.0.0.1:4"))
        assert "ipv4:10.0.0.1:4" not in limit.per_connection.held  # refused: nothing held
        limit.give_back(held[0])
        with limit.hold(_Context("ipv4:10.0.0.1:4")):
            assert limit.per_principal.held == {"alice": 3}  # type: ignore[union-attr]
    finally:
        CALLER.reset(token)
    # A proxy acting for alice counts against alice; the proxy acting as itself is not counted.
    token = CALLER.set(_as("alice"))
    try:
        via_proxy = _Context("ipv4:10.0.0.9:1", ((ON_BEHALF_OF_HEADER, "alice"),))
        assert limit.take(via_proxy) == ("ipv4:10.0.0.9:1 for alice", "alice")  # her third
        with pytest.raises(PrincipalLimitError):
            limit.take(via_proxy)
    finally:
        CALLER.reset(token)
    token = CALLER.set(_as("proxy", service=True))
    try:
        for _ in range(5):
            limit.take(_Context("ipv4:10.0.0.9:1"))
    finally:
        CALLER.reset(token)
    # Auth off: no principal, the connection's limit alone.
    for _ in range(10):
        limit.take(_Context("ipv4:10.0.0.7:1"))
    with pytest.raises(ConnectionLimitError):
        limit.take(_Context("ipv4:10.0.0.7:1"))


def test_principal_shares_count_streams_and_unary_calls_but_not_long_polls_health_or_services() -> None:
    shares = PrincipalShares(PrincipalLimit("max_streams_per_principal", 1),
                             PrincipalLimit("max_concurrent_rpcs_per_principal", 1, fair_share=True),
                             frozenset({"ReceiveMessages"}))
    alice, broker = Principal("alice"), Principal("broker-0", service=True)
    assert shares.admit("/txmq.v1.BrokerService/Produce", True, alice) is shares.streams
    with pytest.raises(PrincipalLimitError):
        shares.admit("/txmq.v1.CheckerService/CheckTransactionState", True, alice)
    assert shares.admit("/txmq.v1.BrokerService/SendMessage", False, alice) is shares.unary
    with pytest.raises(OverloadedError):
        shares.admit("/txmq.v1.BrokerService/EndTransaction", False, alice)
    # A long poll is the service's own to count (CallerLimit); health and reflection are never counted.
    assert shares.admit("/txmq.v1.BrokerService/ReceiveMessages", False, alice) is None
    assert shares.admit("/grpc.health.v1.Health/Watch", True, alice) is None
    assert shares.admit("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", True, alice) is None
    # A service identity acting as itself: never counted.
    assert shares.admit("/txmq.v1.BrokerService/ClaimChecks", False, broker) is None
    assert shares.admit("/txmq.v1.BrokerService/Produce", True, broker) is None
    shares.streams.give_back("alice")
    assert shares.admit("/txmq.v1.BrokerService/Produce", True, alice) is shares.streams
