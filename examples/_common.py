"""What the examples share: the name server address and creating their topic."""

from __future__ import annotations

import argparse
import os

import grpc

import txmq
from txmq._errors import error_from_rpc
from txmq.v1 import admin_pb2, admin_pb2_grpc


def arguments(description: str, default_topic: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--nameserver", default=os.environ.get("TXMQ_NAMESERVER", "127.0.0.1:9876"),
                        help="name server address list, host:port[,host:port] "
                             "(default: $TXMQ_NAMESERVER or 127.0.0.1:9876)")
    parser.add_argument("--topic", default=default_topic)
    parser.add_argument("--count", type=int, default=6)
    return parser.parse_args()


def ensure_topic(nameservers: str, topic: str, queue_count: int = 4) -> None:
    """Creates the topic through the Admin API of the first name server (what
    ``txmq topic create`` does); an existing topic is fine."""
    address = nameservers.split(",")[0].strip()
    with grpc.insecure_channel(address) as channel:
        try:
            admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
                admin_pb2.CreateTopicRequest(topic=topic, queue_count=queue_count), timeout=10.0)
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
            if not isinstance(error, txmq.TopicExistsError):
                raise error from None
