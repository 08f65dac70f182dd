"""What the examples share: the name server address and creating their topic."""

from __future__ import annotations

import argparse
import os
from typing import Callable

import txmq


def arguments(description: str, default_topic: str,
              more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--nameserver", default=os.environ.get("TXMQ_NAMESERVER", "127.0.0.1:9876"),
                        help="name server address list, host:port[,host:port] "
                             "(default: $TXMQ_NAMESERVER or 127.0.0.1:9876)")
    parser.add_argument("--topic", default=default_topic)
    parser.add_argument("--count", type=int, default=6)
    if more is not None:
        more(parser)
    return parser.parse_args()


def ensure_topic(nameservers: str, topic: str, queue_count: int = 4, *, fifo: bool = False,
                 tls: txmq.TLS | None = None, token: str | None = None) -> None:
    """Creates the topic with the Admin API (what ``txmq topic create`` does); an existing
    topic is fine."""
    with txmq.Admin(nameservers, tls=tls, token=token) as admin:
        try:
            admin.create_topic(topic, queue_count=queue_count, fifo=fifo)
        except txmq.TopicExistsError:
            pass


def state_name(transaction: object) -> str:
    """A transaction row's state (as the Admin API returns it) by name: ``"ROLLED_BACK"``."""
    field = transaction.DESCRIPTOR.fields_by_name["state"]  # type: ignore[attr-defined]
    return field.enum_type.values_by_number[transaction.state].name.removeprefix(  # type: ignore[attr-defined]
        "TRANSACTION_STATE_")
