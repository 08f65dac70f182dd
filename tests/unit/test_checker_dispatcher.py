"""The checker's dispatcher without processes: routing, bookkeeping, what is reported to
the broker, and refusals of bad requests on a stream (which change nothing)."""

from __future__ import annotations

import pytest

from services.checker.dispatcher import Dispatcher, route_order
from services.checker.service import validate_subscribe
from txmq.errors import InvalidFieldError, InvalidNameError, StaleClaimError, TransactionStateError
from txmq.v1 import broker_pb2, checker_pb2, common_pb2

DELIVERED, ANSWERED, UNDELIVERED = (broker_pb2.CHECK_OUTCOME_DELIVERED, broker_pb2.CHECK_OUTCOME_ANSWERED,
                                    broker_pb2.CHECK_OUTCOME_UNDELIVERED)


class Reports:
    def __init__(self) -> None:
        self.sent: list[tuple[str, broker_pb2.CheckReport, object]] = []

    def report(self, broker, report, on_error=None):
        self.sent.append((broker, report, on_error))

    def outcomes(self):
        return [(r.transaction_id, r.outcome) for _, r, _ in self.sent]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Metrics:
    def __init__(self) -> None:
        self.results: list[tuple[str, str]] = []
        self.lags: list[float] = []
        self.connected: dict[str, int] = {}
        self.flight = 0
        self.free: dict[str, int] = {}
        self.late: list[str] = []
        self.refused: list[tuple[str, str]] = []
        self.gone: list[str] = []

    def credit(self, group, free):
        self.free[group] = free

    def late_answer(self, group):
        self.late.append(group)

    def answer_refused(self, group, reason):
        self.refused.append((group, reason))

    def group_gone(self, group):
        self.gone.append(group)

    def check_result(self, group, result):
        self.results.append((group, result))

    def check_lag(self, group, seconds):
        self.lags.append(seconds)

    def producers(self, group, count):
        self.connected[group] = count

    def in_flight(self, group, count):
        self.flight = count


@pytest.fixture
def env():
    reports, clock, metrics = Reports(), Clock(), Metrics()
    d = Dispatcher(checker_name="c", reporter=reports, answer_timeout_seconds=1.0, lease_seconds=5.0,
                   queue_size=2, metrics=metrics, clock=lambda: 2000.0, monotonic=clock)
    return d, reports, clock, metrics


def task(txn="T1", group="g", client="", due_ms=1_999_500, attempt=1):
    return broker_pb2.CheckTask(transaction_id=txn, due_at_ms=due_ms, attempt=attempt, claim_token="tok-" + txn,
                                message=common_pb2.Message(topic="t", producer_group=group,
                                                           producer_client_id=client))


def sent_checks(stream):
    out = []
    while (r := stream.pop()) is not None:
        if r.WhichOneof("command") == "check":
            out.append(r.check)
    return out


# --------------------------------------------------------------------------- routing

def test_route_order_prefers_the_sender_then_round_robin():
    streams = ["a", "b", "c", "d"]
    assert route_order(streams, lambda s: s, "c", 0) == ["c", "a", "b", "d"]
    assert route_order(streams, lambda s: s, "c", 1) == ["c", "b", "d", "a"]
    assert route_order(streams, lambda s: s, "", 2) == ["c", "d", "a", "b"]
    assert route_order(streams, lambda s: s, "gone", 5) == ["b", "c", "d", "a"]
    assert route_order([], lambda s: s, "x", 3) == []


def test_dispatch_prefers_the_instance_that_sent_the_half_message(env):
    d, reports, _, _ = env
    a = d.subscribe("client-a", ["g"])
    b = d.subscribe("client-b", ["g"])
    d.dispatch("broker-0", [task("T1", client="client-b"), task("T2", client="client-b")])
    assert [c.transaction_id for c in sent_checks(b)] == ["T1", "T2"]
    assert sent_checks(a) == []
    assert reports.sent == []


def test_dispatch_round_robins_when_the_sender_is_gone(env):
    d, _, _, _ = env
    a = d.subscribe("client-a", ["g"])
    b = d.subscribe("client-b", ["g"])
    d.dispatch("broker-0", [task("T1", client="dead"), task("T2", client="dead")])
    assert len(sent_checks(a)) == 1 and len(sent_checks(b)) == 1


def test_a_stream_out_of_credit_is_skipped_and_no_credit_anywhere_is_undelivered(env):
    d, reports, _, _ = env
    slow = d.subscribe("slow", ["g"])
    d.dispatch("broker-0", [task("T1", client="slow"), task("T2", client="slow")])  # spends its credit of 2
    fast = d.subscribe("fast", ["g"])
    d.dispatch("broker-0", [task("T3", client="slow")])
    assert [c.transaction_id for c in sent_checks(fast)] == ["T3"]
    assert d.credit.claimable_groups() == ["g"] and d.credit.free["g"] == 1  # fast has one more
    d.dispatch("broker-0", [task("T4"), task("T5"), task("T6")])  # fast takes 1, nobody the others
    assert reports.outcomes() == [("T5", UNDELIVERED), ("T6", UNDELIVERED)]
    assert len(sent_checks(slow)) == 2 and d.credit.claimable_groups() == []


def test_no_stream_for_the_group_is_undelivered_at_once(env):
    d, reports, _, metrics = env
    d.subscribe("a", ["other"])
    d.dispatch("broker-0", [task("T1", group="g")])
    assert reports.outcomes() == [("T1", UNDELIVERED)]
    assert ("g", "undelivered") in metrics.results
    assert d.credit.claimable_groups() == ["other"]


def test_a_stream_serving_two_groups_gets_the_checks_of_both(env):
    d, _, _, metrics = env
    s = d.subscribe("a", ["g1", "g2"])
    d.dispatch("broker-0", [task("T1", group="g1"), task("T2", group="g2")])
    assert [c.transaction_id for c in sent_checks(s)] == ["T1", "T2"]
    assert metrics.connected == {"g1": 1, "g2": 1}


# --------------------------------------------------------------------------- the life of a check

def test_received_then_answered_reports_delivered_then_answered(env):
    d, reports, _, metrics = env
    s = d.subscribe("a", ["g"])
    d.dispatch("broker-0", [task("T1", client="a")])
    (check,) = sent_checks(s)
    assert check.attempt == 1 and check.answer_timeout_seconds == 1.0 and check.broker_name == "broker-0"
    d.received(s, check.check_id)
    d.received(s, check.check_id)  # repeated: harmless
    assert metrics.lags == [0.5]  # due 1999.5 s, acknowledged at 2000 s
    d.answered(s, check.check_id, common_pb2.CHECK_RESULT_COMMIT, 0)
    assert reports.outcomes() == [("T1", DELIVERED), ("T1", ANSWERED)]
    delivered, answered = reports.sent[0][1], reports.sent[1][1]
    assert delivered.claim_token == "tok-T1" and delivered.producer_client_id == "a"
    assert delivered.answer_timeout_seconds == 1.0
    assert answered.result == common_pb2.CHECK_RESULT_COMMIT
    assert d.deliveries == {} and metrics.flight == 0
    assert [r for _, r in metrics.results] == ["delivered", "commit"]


def test_an_answer_without_received_counts_as_both(env):
    d, reports, _, _ = env
    s = d.subscribe("a", ["g"])
    d.dispatch("broker-0", [task("T1")])
    (check,) = sent_checks(s)
    d.answered(s, check.check_id, common_pb2.CHECK_RESULT_IN_PROGRESS, 2.5)
    assert reports.outcomes() == [("T1", DELIVERED), ("T1", ANSWERED)]
    assert reports.sent[1][1].retry_after_seconds == 2.5


@pytest.mark.parametrize("result, retry_after, field", [
    (common_pb2.CHECK_RESULT_UNSPECIFIED, 0, "result"),
    (99, 0, "result"),
    (common_pb2.CHECK_RESULT_IN_PROGRESS, 0, "retry_after_seconds"),
    (common_pb2.CHECK_RESULT_IN_PROGRESS, float("nan"), "retry_after_seconds"),
    (common_pb2.CHECK_RESULT_COMMIT, 3.0, "retry_after_seconds"),
])
def test_bad_answers_are_refused_and_change_nothing(env, result, retry_after, field):
    d, reports, _, _ = env
    s = d.subscribe("a", ["g"])
    d.dispatch("broker-0", [task("T1")])
    (check,) = sent_checks(s)
    with pytest.raises(InvalidFieldError) as info:
        d.answered(s, check.check_id, result, retry_after)
    assert info.value.field == field
    assert reports.sent == [] and check.check_id in d.deliveries


def test_unknown_or_foreign_check_ids_are_refused_and_change_nothing(env):
    d, reports, _, _ = env
    mine = d.subscribe("a", ["g"])
    other = d.subscribe("b", ["h"])
    d.dispatch("broker-0", [task("T1", group="g")])
    (check,) = sent_checks(mine)
    for stream, check_id in ((mine, "nope"), (other, check.check_id), (mine, "")):
        with pytest.raises(InvalidFieldError):
            d.received(stream, check_id)
        with pytest.raises(InvalidFieldError):
            d.answered(stream, check_id, common_pb2.CHECK_RESULT_COMMIT, 0)
    assert reports.sent == []
    d.answered(mine, check.check_id, common_pb2.CHECK_RESULT_ROLLBACK, 0)
    with pytest.raises(InvalidFieldError):  # already answered
        d.answered(mine, check.check_id, common_pb2.CHECK_RESULT_COMMIT, 0)


def test_a_broker_refusal_of_an_answer_comes_back_on_the_stream(env):
    d, reports, _, _ = env
    s = d.subscribe("a", ["g"])
    d.dispatch("broker-0", [task("T1")])
    (check,) = sent_checks(s)
    d.answered(s, check.check_id, common_pb2.CHECK_RESULT_COMMIT, 0)
    _, _, on_error = reports.sent[-1]
    on_error(StaleClaimError("T1", "superseded"))
    response = s.pop()
    assert response.WhichOneof("command") == "error"
    assert response.error.reason == "STALE_CLAIM"
    assert check.check_id in response.error.details["check_id"]


def test_a_stream_that_ends_hands_back_unacknowledged_checks_only(env):
    d, reports, _, metrics = env
    s = d.subscribe("a", ["g"])
    d.dispatch("broker-0", [task("T1"), task("T2")])
    first, _second = sent_checks(s)
    d.received(s, first.check_id)
    d.unsubscribe(s)
    assert reports.outcomes() == [("T1", DELIVERED), ("T2", UNDELIVERED)]
    assert d.deliveries == {} and metrics.connected == {"g": 0} and d.credit.claimable_groups() == []
    assert d.credit.total_free == 0 and d.credit.capacity == {}
    d.unsubscribe(s)  # idempotent
    assert len(reports.sent) == 2


def test_a_draining_stream_gets_no_checks_hands_back_unstarted_ones_and_still_answers(env):
    d, reports, _, metrics = env
    d.queue_size = 10
    leaving = d.subscribe("a", ["g"], credit=3)
    staying = d.subscribe("b", ["g"], credit=3)
    d.dispatch("broker-0", [task("T1", client="a"), task("T2", client="a")])
    started, unstarted = sent_checks(leaving)
    d.received(leaving, started.check_id)
    d.drain(leaving)
    # The unstarted check goes back at once; the group's capacity is the other stream's.
    assert reports.outcomes() == [("T1", DELIVERED), ("T2", UNDELIVERED)]
    assert metrics.connected == {"g": 1} and d.credit.capacity == {"g": 3} and d.credit.free == {"g": 3}
    d.grant(leaving, 2)  # ignored: it takes no more checks
    assert d.credit.free == {"g": 3}
    d.dispatch("broker-0", [task("T3", client="a")])
    assert sent_checks(leaving) == [] and [c.transaction_id for c in sent_checks(staying)] == ["T3"]
    # The answer it owed still counts as the answer to its check.
    d.answered(leaving, started.check_id, common_pb2.CHECK_RESULT_COMMIT, 0)
    assert reports.outcomes()[-1] == ("T1", ANSWERED) and ("g", "commit") in metrics.results
    assert set(d.deliveries) == staying.checks and metrics.late == []
    d.drain(leaving)  # idempotent
    d.unsubscribe(leaving)
    assert d.credit.capacity == {"g": 3} and d.credit.free == {"g": 2} and d.credit.total_free == 2 and metrics.connected == {"g": 1}


def test_timeouts(env):
    d, reports, clock, metrics = env
    s = d.subscribe("a", ["g"])
    d.dispatch("broker-0", [task("T1"), task("T2")])
    acked, silent = sent_checks(s)
    d.received(s, acked.check_id)
    clock.now += 1.01
    d.expire()
    # Not acknowledged in time: handed back. Acknowledged but unanswered: a timeout, kept.
    assert reports.outcomes() == [("T1", DELIVERED), ("T2", UNDELIVERED)]
    assert ("g", "timeout") in metrics.results and metrics.flight == 0
    # A late answer within the lease is still reported.
    d.answered(s, acked.check_id, common_pb2.CHECK_RESULT_COMMIT, 0)
    assert reports.outcomes()[-1] == ("T1", ANSWERED)
    # One never answered is forgotten after the lease.
    d.dispatch("broker-0", [task("T3")])
    (late,) = sent_checks(s)
    d.received(s, late.check_id)
    clock.now += 1.01
    d.expire()
    clock.now += 5.01
    d.expire()
    assert d.deliveries == {}
    with pytest.raises(InvalidFieldError):
        d.answered(s, late.check_id, common_pb2.CHECK_RESULT_COMMIT, 0)


# --------------------------------------------------------------------------- flow control

def test_a_stream_gets_no_more_than_its_credit_and_credit_comes_from_the_producer(env):
    d, reports, clock, _ = env
    d.queue_size = 100
    s = d.subscribe("a", ["g"], credit=3)
    assert d.credit.claim_groups() == {"g": 3} and d.credit.claim_limits() == {}  # idle: the capacity
    d.dispatch("broker-0", [task(f"T{i}") for i in range(5)])
    checks = sent_checks(s)
    assert len(checks) == 3 and reports.outcomes() == [("T3", UNDELIVERED), ("T4", UNDELIVERED)]
    assert d.credit.claim_limits() == {"g": 0} and d.credit.claim_limits(2) == {"g": 0}
    # Answering gives nothing back by itself; the producer's credit does.
    d.answered(s, checks[0].check_id, common_pb2.CHECK_RESULT_COMMIT, 0)
    assert d.credit.free["g"] == 0
    d.grant(s, 1)
    assert d.credit.claim_limits() == {"g": 1}
    with pytest.raises(InvalidFieldError):
        d.grant(s, 0)
    # A check the producer never starts is handed back after the answer timeout; its
    # credit stays spent (the producer still holds it) — a stuck producer gets no more.
    clock.now += 1.01
    d.expire()
    assert reports.outcomes()[-2:] == [("T1", UNDELIVERED), ("T2", UNDELIVERED)] and d.credit.free["g"] == 1
    # Capacities are split between brokers, and a new stream changes the claim version.
    version = d.membership.version
    d.subscribe("b", ["g"], credit=4)
    assert d.membership.version > version and d.credit.claim_groups(2) == {"g": 4} and d.credit.claim_limits(2) == {"g": 3}


def test_a_group_that_got_its_whole_limit_is_claimed_again_once_it_has_credit(env):
    d, _, _, _ = env
    d.queue_size = 100
    s = d.subscribe("a", ["g"], credit=4)
    d.subscribe("b", ["h"], credit=4)
    tasks = [task(f"T{i}") for i in range(4)] + [task("U1", group="h")]
    d.dispatch("broker-0", tasks)
    d.credit.claimed(tasks, {})  # g got all 4 it could take (more may be due), h only 1 of 4
    assert d.credit.backlogged == {"g"}
    assert not d.credit.backlog_has_credit()  # g has no credit left
    d.grant(s, 1)
    assert not d.credit.backlog_has_credit()  # less than half its capacity: not worth a claim yet
    d.grant(s, 1)
    assert d.credit.backlog_has_credit()
    d.credit.claimed([], {"g": 2})  # the next claim found nothing more
    assert d.credit.backlogged == set() and not d.credit.backlog_has_credit()


def test_a_stream_without_flow_control_gets_the_default_credit_back_as_checks_end(env):
    d, reports, clock, _ = env
    s = d.subscribe("old", ["g"])  # credit 0: the default (2 here)
    d.dispatch("broker-0", [task("T1"), task("T2"), task("T3")])
    first, second = sent_checks(s)
    assert reports.outcomes() == [("T3", UNDELIVERED)]
    d.answered(s, first.check_id, common_pb2.CHECK_RESULT_COMMIT, 0)
    assert d.credit.free["g"] == 1
    clock.now += 1.01
    d.expire()  # never started: handed back, and its credit with it
    assert d.credit.free["g"] == 2


def test_a_late_answer_naming_its_transaction_goes_to_the_broker_without_a_claim(env):
    d, reports, clock, metrics = env
    s = d.subscribe("a", ["g"], credit=2)
    d.dispatch("broker-0", [task("T1")])
    (check,) = sent_checks(s)
    d.received(s, check.check_id)
    clock.now += 1.01
    d.expire()
    clock.now += 5.01
    d.expire()  # forgotten
    late = dict(transaction_id="T1", broker_name="broker-0", producer_group="g")
    d.answered(s, check.check_id, common_pb2.CHECK_RESULT_COMMIT, 0, **late)
    _, report, on_error = reports.sent[-1]
    assert report.outcome == ANSWERED and report.claim_token == "" and report.producer_group == "g"
    on_error(TransactionStateError("T1", "ROLLED_BACK", "COMMIT"))
    assert metrics.refused == [("g", "conflict")] and s.pop().error.reason == "TRANSACTION_STATE_CONFLICT"
    count = len(reports.sent)
    d.answered(s, "gone", common_pb2.CHECK_RESULT_UNKNOWN, 0, **late)  # late UNKNOWN: nothing to do
    assert len(reports.sent) == count
    for bad in (dict(late, producer_group="h"), dict(late, broker_name="")):
        with pytest.raises(InvalidFieldError):
            d.answered(s, "gone", common_pb2.CHECK_RESULT_COMMIT, 0, **bad)
    assert len(reports.sent) == count


# --------------------------------------------------------------------------- subscribe validation

def sub(groups, client_id="c", credit=0):
    return checker_pb2.CheckTransactionStateRequest(
        subscribe=checker_pb2.Subscribe(producer_groups=groups, client_id=client_id, check_credit=credit))


def test_validate_subscribe():
    assert validate_subscribe(sub(["g", "h", "g"]), 8) == ("c", ("g", "h"), 0)
    assert validate_subscribe(sub(["g"], credit=16), 8) == ("c", ("g",), 16)
    with pytest.raises(InvalidFieldError):
        validate_subscribe(sub(["g"], credit=-1), 8)
    with pytest.raises(InvalidFieldError):
        validate_subscribe(checker_pb2.CheckTransactionStateRequest(
            received=checker_pb2.CheckReceived(check_id="x")), 8)
    with pytest.raises(InvalidFieldError):
        validate_subscribe(checker_pb2.CheckTransactionStateRequest(), 8)
    with pytest.raises(InvalidFieldError):
        validate_subscribe(sub([]), 8)
    with pytest.raises(InvalidFieldError):
        validate_subscribe(sub(["g"], client_id=""), 8)
    with pytest.raises(InvalidFieldError):
        validate_subscribe(sub(["g"], client_id="x" * 256), 8)
    with pytest.raises(InvalidFieldError):
        validate_subscribe(sub(["a", "b", "c"]), 2)
    with pytest.raises(InvalidNameError):
        validate_subscribe(sub(["bad group"]), 8)
    with pytest.raises(InvalidNameError):
        validate_subscribe(sub(["%DISCARD%g"]), 8)


def test_a_group_that_leaves_keeps_its_series_only_if_a_claimed_check_counted() -> None:
    """CheckerMetrics.group_gone: a group whose last producer left loses its gauges; a group no
    claimed check ever counted for (a made-up name, answered late or refused at most) loses
    every series, so names a producer makes up do not pile up on /metrics."""
    from prometheus_client import generate_latest

    from services.checker.metrics import CheckerMetrics

    metrics = CheckerMetrics()
    for group in ("real", "made-up"):
        metrics.producers(group, 1)
        metrics.credit(group, 4)
    metrics.check_result("real", "delivered")
    metrics.check_result("made-up", "commit")  # a late answer naming any transaction
    metrics.answer_refused("made-up", "invalid")
    before = generate_latest(metrics.registry).decode()
    for reason in ("conflict", "stale", "not_outstanding", "invalid", "unavailable", "revoked"):
        assert f'txmq_check_answers_refused_total{{group="real",reason="{reason}"}} 0.0' in before
    for group in ("real", "made-up"):
        metrics.group_gone(group)
    text = generate_latest(metrics.registry).decode()
    assert 'group="made-up"' not in text
    assert 'txmq_checks_total{group="real",result="delivered"} 1.0' in text
    assert 'txmq_producers_connected{group="real"}' not in text
