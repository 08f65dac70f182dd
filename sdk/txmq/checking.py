"""The check-stream protocol without I/O (see ``txmq._checking``): one checker stream's
session, subscription, response kinds and reconnect backoff, and a producer's answering
(credit, what counts as received, late answers, the resend window).

The public home of ``txmq._checking`` (the RocketMQ proxy's check relay drives
:class:`CheckStream`)."""

from ._checking import (  # re-exported
    CHECK_CREDIT_PER_THREAD,
    MAX_UNSENT_ANSWERS,
    RECONNECT_BACKOFF_MAX_SECONDS,
    RECONNECT_BACKOFF_SECONDS,
    RESEND_WINDOW_SECONDS,
    Backoff,
    Check,
    CheckAnswering,
    CheckStream,
    Refused,
    Subscribed,
    answer_for,
    check_answer,
    check_message,
)

__all__ = [
    "CHECK_CREDIT_PER_THREAD",
    "MAX_UNSENT_ANSWERS",
    "RECONNECT_BACKOFF_MAX_SECONDS",
    "RECONNECT_BACKOFF_SECONDS",
    "RESEND_WINDOW_SECONDS",
    "Backoff",
    "Check",
    "CheckAnswering",
    "CheckStream",
    "Refused",
    "Subscribed",
    "answer_for",
    "check_answer",
    "check_message",
]
