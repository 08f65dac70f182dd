"""A checker's claim that finds nothing due is held on the broker (``claim_wait_seconds``,
broker.proto ClaimChecksRequest.wait_ms, services/broker/claimwaits.py): an idle checker
claims about once per wait instead of every ``claim_interval_seconds``, and a check that
falls due meanwhile (a new half message's first check) ends the hold at once. Counted, not
timed: the window's claims against what one claim per wait allows, and a check decided long
before a 30 s hold would have ended."""

from __future__ import annotations

import time

import txmq
from tests.integration.test_checks import COMMITTED, Listener, producer, wait_state
from tests.support import presets
from tests.support.metrics import metric_sum
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState


def claims(cluster) -> float:
    return metric_sum(cluster.brokers[0].metrics_port, "txmq_rpc_duration_seconds_count", {"method": "ClaimChecks"})


def test_an_idle_checker_claims_about_once_per_wait(fresh_cluster_factory, unique_name):
    wait = 1.0
    cluster = fresh_cluster_factory(broker_env=presets.CHECKS_BROKER, checker=True,
                                    checker_env={**presets.QUICK_CHECKER, "TXMQ_CLAIM_WAIT_SECONDS": str(wait)})
    with producer(cluster, unique_name("g"), Listener()):  # the checker has credit: it claims
        wait_until(lambda: claims(cluster) >= 2, 15, message="the checker never claimed")
        before, started = claims(cluster), time.monotonic()
        wait_until(lambda: time.monotonic() - started >= 4 * wait, 30, interval=0.2)
        made, seconds = claims(cluster) - before, time.monotonic() - started
    interval = float(presets.QUICK_CHECKER.get("TXMQ_CLAIM_INTERVAL_SECONDS", 0.2))
    # One claim per wait (and the one in flight at each end); claiming every interval, as
    # before, makes about seconds / interval.
    assert made <= seconds / wait + 2, f"{made:.0f} claims in {seconds:.1f} s of idleness"
    assert seconds / interval > seconds / wait + 2


def test_a_check_falling_due_ends_a_held_claim(fresh_cluster_factory, unique_name):
    """Held for up to 30 s, the claim is answered once the transaction's first check falls
    due (0.3 s after its half message), and again for the check rescheduled after the
    producer's UNKNOWN."""
    cluster = fresh_cluster_factory(broker_env=presets.CHECKS_BROKER, checker=True,
                                    checker_env={**presets.QUICK_CHECKER, "TXMQ_CLAIM_WAIT_SECONDS": "30"})
    topic = unique_name("orders")
    cluster.create_topic(topic, 1)
    answers = iter([LocalState.UNKNOWN])
    listener = Listener(check=lambda m: next(answers, LocalState.COMMIT))
    with producer(cluster, unique_name("g"), listener) as p:  # subscribed: the checker's claim is held
        started = time.monotonic()
        result = p.send_in_transaction(txmq.Message(topic, b"held"))
        wait_state(cluster, result.transaction_id, COMMITTED, timeout=15)
        seconds = time.monotonic() - started
    assert len(listener.calls(result.transaction_id)) == 2  # UNKNOWN, then COMMIT
    # The claims were held (claiming every 50 ms would have made ~20 a second): a few for
    # the two checks and the floors their keys left behind.
    assert claims(cluster) <= 10 + seconds, f"{claims(cluster):.0f} claims in {seconds:.1f} s"
