"""A burst of the official Python client's ``send_async`` through the proxy while the
broker sheds load (issue 13 item 6): every send succeeds and is stored once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.proxy.support import Clients
from txmq.v1 import admin_pb2, broker_pb2, broker_pb2_grpc

#: A thousand sends at once through a broker shedding load: the heavy lane (tests/support/lanes.py).
pytestmark = pytest.mark.heavy


def test_send_async_burst_through_the_proxy_loses_nothing(fresh_cluster_factory: Any, clients: Clients,
                                                          unique_name: Any) -> None:
    # One call at a time on the broker: most of the proxy's concurrent sends are shed
    # (OVERLOADED) and retried by the proxy; the client never sees a refusal.
    c = fresh_cluster_factory(broker_env={"TXMQ_MAX_CONCURRENT_RPCS": "1"}, proxies=1,
                              nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true"})
    topic, count = unique_name("burst"), 1000
    c.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=2), timeout=5)
    client = clients.python("burst", timeout=120, endpoints=c.proxy_addresses[0], topic=topic, count=count)
    (event,) = client.wait_event("burst", timeout=120)
    assert event["failed"] == {}, event["samples"]
    assert event["sent"] == count and len(set(event["message_ids"])) == count
    stub = broker_pb2_grpc.BrokerServiceStub(c.channel(c.brokers[0].address))
    offsets = stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic=topic), timeout=5)
    assert sum(q.max_offset - q.min_offset for q in offsets.queues) == count
