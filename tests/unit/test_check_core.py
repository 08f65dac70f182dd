"""The check-stream core (``txmq._checking``) without a checker: what goes on which stream,
credit, what counts as received, late answers, the resend window and its reasons, and the
answers a producer gives without asking the application. The thread and asyncio drivers
are tested against real checkers in tests/integration/test_check_drivers.py."""

from __future__ import annotations

import pytest
import txmq
from txmq._checking import (
    CHECK_CREDIT_PER_THREAD,
    MAX_UNSENT_ANSWERS,
    RESEND_WINDOW_SECONDS,
    Backoff,
    Check,
    CheckAnswering,
    Refused,
    Subscribed,
    answer_locally,
)
from txmq.v1 import checker_pb2, common_pb2

COMMIT = txmq.LocalTransactionState.COMMIT
UNKNOWN = txmq.LocalTransactionState.UNKNOWN


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def check(n: int) -> checker_pb2.CheckRequest:
    return checker_pb2.CheckRequest(check_id=f"c{n}", transaction_id=f"T{n}", broker_name="broker-0",
                                    message=common_pb2.Message(message_id=f"M{n}", producer_group="g"))


def kinds(outbox: list) -> list[str]:
    return [r.WhichOneof("command") for r in outbox]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def core(clock: Clock) -> CheckAnswering:
    return CheckAnswering(producer_group="g", client_id="p1", workers=2, clock=clock)


def opened(core: CheckAnswering, live: dict[str, str]):
    """Streams to every checker of ``live``, open and subscribed: {address: (stream, session, outbox)}."""
    new, gone = core.refreshed(live)
    assert gone == []
    out = {}
    for stream in new:
        outbox: list = []
        session, subscribe = stream.open(outbox.append)
        outbox.append(subscribe)
        core.subscribed(stream, stream.checker_name)
        out[stream.address] = (stream, session, outbox)
    return out


def test_subscribe_grants_credit_per_worker_and_sessions_count_up(core):
    (stream,), _ = core.refreshed({"a:1": "checker-a"})
    outbox: list = []
    session, subscribe = stream.open(outbox.append)
    assert session == 1
    assert (list(subscribe.subscribe.producer_groups), subscribe.subscribe.client_id,
            subscribe.subscribe.check_credit) == (["g"], "p1", CHECK_CREDIT_PER_THREAD * 2)
    core.ended(stream)
    assert stream.open(outbox.append)[0] == 2


def test_responses_are_classified(core):
    (stream,), _ = core.refreshed({"a:1": "checker-a"})
    stream.open([].append)
    response = checker_pb2.CheckTransactionStateResponse
    assert stream.classify(response(check=check(1)), 1) == Check(check(1), 1)
    assert stream.classify(response(subscribed=checker_pb2.Subscribed(checker_name="real")), 1) == Subscribed("real")
    refused = stream.classify(response(error=common_pb2.EntryStatus(code=3, message="bad", reason="INVALID_FIELD",
                                                                   details={"field": '"check_id"'})), 1)
    assert isinstance(refused, Refused) and refused.level < 30  # a check handed back: expected, not a warning


def test_received_and_the_answer_go_on_the_checks_own_session_with_credit(core):
    streams = opened(core, {"a:1": "checker-a"})
    stream, session, outbox = streams["a:1"]
    assert core.started(stream, check(1), session)
    core.answered(stream, check(1), COMMIT, session)
    assert kinds(outbox) == ["subscribe", "received", "answer"]
    answer = outbox[-1].answer
    assert (answer.check_id, answer.result, answer.transaction_id, answer.broker_name, answer.producer_group,
            answer.credit) == ("c1", common_pb2.CHECK_RESULT_COMMIT, "T1", "broker-0", "g", 1)


def test_a_check_of_an_ended_session_is_not_received_and_its_decision_goes_late_elsewhere(core):
    streams = opened(core, {"a:1": "checker-a", "b:1": "checker-b"})
    a, a_session, a_out = streams["a:1"]
    b, _, b_out = streams["b:1"]
    core.ended(a)
    new_outbox: list = []
    a.open(new_outbox.append)  # reopened: a new session, not subscribed yet
    assert not core.started(a, check(1), a_session)
    core.answered(a, check(1), COMMIT, a_session)
    core.answered(a, check(2), UNKNOWN, a_session)  # undecided: dropped, the check comes again
    assert kinds(a_out) == ["subscribe"] and new_outbox == []
    assert kinds(b_out) == ["subscribe", "answer"]
    late = b_out[-1].answer
    assert (late.transaction_id, late.result, late.credit) == ("T1", common_pb2.CHECK_RESULT_COMMIT, 0)


def test_late_answers_wait_for_a_subscribed_stream_and_the_oldest_go_first(core):
    (stream,), _ = core.refreshed({"a:1": "checker-a"})
    stream.open([].append)
    core.ended(stream)
    for n in range(MAX_UNSENT_ANSWERS + 2):
        core.answered(stream, check(n), COMMIT, 1)
    assert core.unsent == MAX_UNSENT_ANSWERS
    outbox: list = []
    stream.open(outbox.append)
    core.subscribed(stream, "checker-a")
    assert core.unsent == 0 and len(outbox) == MAX_UNSENT_ANSWERS
    assert outbox[0].answer.transaction_id == "T2"  # T0 and T1 were dropped


@pytest.mark.parametrize("why", ["failed", "checker left", "closing"])
def test_decisions_of_the_resend_window_go_again_whenever_a_stream_ends(core, clock, why):
    streams = opened(core, {"a:1": "checker-a", "b:1": "checker-b"})
    a, session, a_out = streams["a:1"]
    b, _, b_out = streams["b:1"]
    core.answered(a, check(1), COMMIT, session)              # outside the window by the end
    clock.now += RESEND_WINDOW_SECONDS + 1
    core.answered(a, check(2), txmq.LocalTransactionState.ROLLBACK, session)
    core.answered(a, check(3), UNKNOWN, session)             # no decision: never repeated
    core.answered(a, check(4), txmq.InProgress(retry_after_seconds=1), session)
    if why == "checker left":
        assert core.refreshed({"b:1": "checker-b"}) == ([], [a])
    elif why == "closing":
        assert set(core.close()) == {a, b}
    core.ended(a)
    resent = [r.answer for r in b_out if r.WhichOneof("command") == "answer"]
    if why == "closing":  # no stream to take them: kept (and dropped with the producer)
        assert resent == [] and core.unsent == 1
    else:
        assert [(r.transaction_id, r.result, r.credit) for r in resent] == [
            ("T2", common_pb2.CHECK_RESULT_ROLLBACK, 0)]
    # Once resent, the window starts afresh: a second end repeats nothing.
    core.ended(a)
    assert len([r for r in b_out if r.WhichOneof("command") == "answer"]) == len(resent) and core.unsent <= 1


def test_refresh_opens_new_checkers_and_closes_those_gone_and_nothing_once_closing(core):
    new, gone = core.refreshed({"a:1": "checker-a", "b:1": "checker-b"})
    assert sorted(s.address for s in new) == ["a:1", "b:1"] and gone == []
    new2, gone2 = core.refreshed({"b:1": "checker-b", "c:1": "checker-c"})
    assert [s.address for s in new2] == ["c:1"] and [s.address for s in gone2] == ["a:1"]
    assert core.connected == []  # none subscribed yet
    assert sorted(s.address for s in core.close()) == ["b:1", "c:1"]
    assert core.refreshed({"d:1": "checker-d"}) == ([], [])


def test_connected_names_the_subscribed_checkers_by_their_own_names(core):
    streams = opened(core, {"a:1": "listed-name"})
    stream = streams["a:1"][0]
    core.subscribed(stream, "checker-real")
    assert core.connected == ["checker-real"]
    core.ended(stream)
    assert core.connected == []


def test_a_failure_is_reported_once_and_the_recovery_once():
    core = CheckAnswering(producer_group="g", client_id="p", workers=1)
    (stream,), _ = core.refreshed({"a:1": "a"})
    stream.open([].append)
    assert stream.failed() and not stream.failed()
    assert core.subscribed(stream, "a") and not core.subscribed(stream, "a")


def test_backoff_doubles_with_jitter_up_to_its_cap_and_resets():
    backoff = Backoff(0.1, 0.5, jitter=lambda: 0.5)
    assert [round(backoff.pause(), 3) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.pause() == pytest.approx(0.1)
    low, high = Backoff(1.0, 1.0, jitter=lambda: 0.0), Backoff(1.0, 1.0, jitter=lambda: 0.999)
    assert low.pause() == 0.5 and high.pause() == pytest.approx(1.499)


def test_answers_given_without_asking_the_application():
    message = txmq.TransactionMessage(message=txmq.Message("t", b""), message_id="M1", transaction_id="T1",
                                      broker_name="broker-0", queue_id=0)
    assert answer_locally(message, {"M1"}, set(), 5.0) is txmq.LocalTransactionState.ROLLBACK
    assert answer_locally(message, set(), {"M1"}, 5.0) == txmq.InProgress(retry_after_seconds=5.0)
    assert answer_locally(message, {"M1"}, {"M1"}, 5.0) is txmq.LocalTransactionState.ROLLBACK  # orphan first
    assert answer_locally(message, set(), set(), 5.0) is None
