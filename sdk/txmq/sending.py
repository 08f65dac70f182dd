"""The producers' send and retry logic without I/O (see ``txmq._sending``): a send, a part
bound to its shard and an EndTransaction as generators of steps (``Pick``, ``Request``,
``Sleep``, ``Rebind``) that a driver performs, and how an outcome counts in the fault table.

The public home of ``txmq._sending`` (the Spark sink drives these steps)."""

from ._sending import (  # re-exported
    Pick,
    Rebind,
    Request,
    Sleep,
    Step,
    Steps,
    backoff_seconds,
    end_transaction,
    finished,
    run,
    send_bound,
    send_new,
)

__all__ = [
    "Pick",
    "Rebind",
    "Request",
    "Sleep",
    "Step",
    "Steps",
    "backoff_seconds",
    "end_transaction",
    "finished",
    "run",
    "send_bound",
    "send_new",
]
