"""What the examples share: the name server address and creating their topic."""

from __future__ import annotations

import argparse
import os

import txmq


def arguments(description: str, default_topic: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--nameserver", default=os.environ.get("TXMQ_NAMESERVER", "127.0.0.1:9876"),
                        help="name server address list, host:port[,host:port] "
                             "(default: $TXMQ_NAMESERVER or 127.0.0.1:9876)")
    parser.add_argument("--topic", default=default_topic)
    parser.add_argument("--count", type=int, default=6)
    return parser.parse_args()


def ensure_topic(nameservers: str, topic: str, queue_count: int = 4) -> None:
    """Creates the topic with the Admin API (what ``txmq topic create`` does); an existing
    topic is fine."""
    with txmq.Admin(nameservers) as admin:
        try:
            admin.create_topic(topic, queue_count=queue_count)
        except txmq.TopicExistsError:
            pass
