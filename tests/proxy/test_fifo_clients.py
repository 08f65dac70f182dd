"""FIFO message groups through the proxy with the official RocketMQ 5 clients (Python and
Node.js, unmodified): routes advertise FIFO for a FIFO topic, the producers send FIFO
messages (a message group each) to the group's queue, the push consumers get
``Settings.subscription.fifo`` and consume each group in order, and a message the FIFO
consumer gives up on (after its local retries) is forwarded to ``%DLQ%<group>``
(ForwardMessageToDeadLetterQueue), after which its group goes on."""

from __future__ import annotations

from typing import Callable

import pytest

from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2

from .support import Clients, node_ready
from .test_python_client import receive_native

pytestmark = pytest.mark.timeout(180)

GROUPS = ["order-a", "order-b"]
BODIES = {"order-a": ["a-0", "a-1", "fail-a-2", "a-3"], "order-b": ["b-0", "b-1", "b-2"]}


def create_fifo(cluster: Cluster, topic: str) -> None:
    cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(
        topic=topic, queue_count=2, topic_type=common_pb2.TOPIC_TYPE_FIFO), timeout=10)
    cluster.wait_route(topic, 2)


def interleaved() -> tuple[list[str], list[str]]:
    """The bodies and their groups, the two groups interleaved."""
    bodies, groups = [], []
    for i in range(max(len(b) for b in BODIES.values())):
        for g in GROUPS:
            if i < len(BODIES[g]):
                bodies.append(BODIES[g][i])
                groups.append(g)
    return bodies, groups


def check_fifo_consumption(consumed: list[dict], max_attempts: int) -> None:
    """Per group: the consumptions in send order; the failing message tried
    ``max_attempts`` times in a row, then its group went on without it."""
    for g in GROUPS:
        seen = [e["body"] for e in consumed if e["message_group"] == g]
        want = [b for b in BODIES[g] for _ in range(max_attempts if b.startswith("fail") else 1)]
        assert seen == want, (g, seen)


def run(rmq_cluster: Cluster, clients: Clients, unique_name: Callable[[str], str], runner: str) -> None:
    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(rmq_cluster, topic)
    proxy = rmq_cluster.proxy_addresses[0]
    start = clients.python if runner == "python" else (lambda *a, **k: clients.node("rmq_node.js", *a, **k))
    consumer = start("push", endpoints=proxy, topic=topic, group=group)
    consumer.wait_event("started", timeout=60)
    bodies, groups = interleaved()
    sender = start("send", endpoints=proxy, topic=topic, bodies=bodies, groups=groups)
    sender.expect_success(60)
    sent = {e["body"]: e["message_id"] for e in sender.of("sent")}
    max_attempts = 3  # the brokers' max_delivery_attempts in this module (the clients' local retries)
    total = sum(len(b) for b in BODIES.values()) + max_attempts - 1
    consumer.wait(lambda c: len(c.of("consumed")) >= total, 90, f"{total} consumptions")
    dead = wait_until(lambda: receive_native(rmq_cluster, unique_name("dlq"), f"%DLQ%{group}", 1, timeout=1.0),
                      30, message="the forwarded dead letter", ignore=(Exception,))
    consumer.expect_success(60)
    consumed = consumer.of("consumed")
    check_fifo_consumption(consumed, max_attempts)
    assert all(e["delivery_attempt"] >= 1 for e in consumed)
    assert dead[0].body == b"fail-a-2" and dead[0].message_id == sent["fail-a-2"]
    assert dead[0].message_group == "order-a"


def test_python_fifo_producer_and_push_consumer(rmq_cluster: Cluster, clients: Clients,
                                                unique_name: Callable[[str], str]) -> None:
    run(rmq_cluster, clients, unique_name, "python")


@pytest.mark.skipif(node_ready() is not None, reason=node_ready() or "")
def test_node_fifo_producer_and_push_consumer(rmq_cluster: Cluster, clients: Clients,
                                              unique_name: Callable[[str], str]) -> None:
    run(rmq_cluster, clients, unique_name, "node")


def test_a_fifo_message_to_a_normal_topic_is_refused_by_the_route(rmq_cluster: Cluster, clients: Clients,
                                                                   unique_name: Callable[[str], str]) -> None:
    """The route of a normal topic does not accept FIFO messages: the client refuses to send
    one (the broker would refuse it too, naming message_group)."""
    topic = unique_name("plain")
    rmq_cluster.create_topic(topic, queue_count=1)
    sender = clients.python("send", endpoints=rmq_cluster.proxy_addresses[0], topic=topic, bodies=["x"],
                            groups=["g"])
    sender.finish(60)
    [error] = sender.of("error")
    assert "message_type:FIFO" in error["message"] and "FIFO" not in error["message"].split("queue access type:")[1]


# --- the pure parts ------------------------------------------------------------------------

def test_fifo_messages_translate_both_ways_and_settings_say_fifo() -> None:
    from services.proxy import settings
    from services.proxy.codes import code_for
    from services.proxy.convert import delivered_to_rmq, to_native
    from services.proxy.protocol import Code, definition_pb2 as pb
    from txmq.errors import InvalidFieldError

    from .test_translation import CONFIG, rmq_message

    native = to_native(rmq_message(message_type=pb.FIFO, message_group="order-1"), client_id="c", max_body_bytes=10)
    assert native.type == common_pb2.MESSAGE_TYPE_NORMAL and native.message_group == "order-1"
    with pytest.raises(Exception) as info:
        to_native(rmq_message(message_type=pb.FIFO), client_id="c", max_body_bytes=10)
    assert code_for(info.value) == Code.ILLEGAL_MESSAGE_GROUP
    assert code_for(InvalidFieldError("message_group", "topic 't' is FIFO")) == Code.ILLEGAL_MESSAGE_GROUP
    out = delivered_to_rmq(common_pb2.DeliveredMessage(topic="orders", message=common_pb2.Message(
        topic="orders", body=b"x", message_group="order-1"), delivery_attempt=1), 0)
    assert out.system_properties.message_type == pb.FIFO and out.system_properties.message_group == "order-1"
    client = pb.Settings(client_type=pb.PUSH_CONSUMER)
    client.subscription.group.name = "g"
    assert settings.reply(client, CONFIG, fifo=True).subscription.fifo
    assert not settings.reply(client, CONFIG).subscription.fifo
