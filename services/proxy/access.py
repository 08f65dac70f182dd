"""What each RocketMQ RPC needs (the proxy's policy table, enforced by the one auth
interceptor, ``services.common.auth``) and how a refusal is answered: in band, as
``Status{UNAUTHORIZED 40100 | FORBIDDEN 40300}`` in the RPC's own response, which the
official clients raise as UnauthorizedException / ForbiddenException.

The clients sign every request (``authorization: MQv2-HMAC-SHA1 Credential=<access key>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of x-mq-date-time>``); the access
key names a principal of the credential store and the ACL is the native one. A RocketMQ
producer's native producer group is its topic (see ``convert``), so a transactional
producer needs ``check`` on ``producer_group:<topic>`` besides ``publish`` on the topic.
The proxy then calls the native services as its own service identity *acting for* the client
principal (``services.common.auth.delegation``): the brokers and checkers decide each call
again for that principal, against what the ids it carries name in their stores (another
group's transaction, another topic's receipt handle), and the proxy relays their refusal in
band (PERMISSION_DENIED → FORBIDDEN). The checks here refuse early what the names alone
rule out.
"""

from __future__ import annotations

from typing import Any, Mapping

from services.common.auth.acl import CHECK, CONSUMER_GROUP, PRODUCER_GROUP, PUBLISH, SUBSCRIBE, TOPIC
from services.common.auth.policy import ANY, OPEN, Need, Policy
from txmq.client import MAX_ENTRIES_PER_REQUEST
from txmq.errors import InvalidFieldError, TxmqError

from .codes import ProxyError, status
from .convert import resource_name
from .protocol import SERVICE_NAME, definition_pb2, service_pb2

_PREFIX = f"/{SERVICE_NAME}/"
#: Most entries of a repeated field a request may carry (messages of a send, topics or
#: subscriptions of a Settings, entries of an ack). The official clients send a few; the
#: policy below is decided per entry on the proxy's one event loop, so a request of a million
#: (3 MB named ``ra`` 500,000 times) held every tenant's calls for seconds.
MAX_ENTRIES = MAX_ENTRIES_PER_REQUEST


def _bounded(items: Any, field: str) -> Any:
    """``items`` (a repeated field), refused naming ``field`` beyond MAX_ENTRIES."""
    if len(items) > MAX_ENTRIES:
        raise InvalidFieldError(field, f"at most {MAX_ENTRIES} entries per request, got {len(items)}")
    return items


def _name(resource: Any) -> str:
    """The native name (``<namespace>%<name>``) the service will use; a bad one is checked
    as given and refused by the service."""
    try:
        return resource_name(resource, "resource")
    except ProxyError:
        return resource.name


def _topic(actions: tuple[str, ...], resource: Any) -> Need:
    return Need(actions, TOPIC, _name(resource))


def _consume(group: Any, topic: Any) -> list[Need]:
    return [Need((SUBSCRIBE,), CONSUMER_GROUP, _name(group)), _topic((SUBSCRIBE,), topic)]


def _send(request: Any) -> list[Need]:
    needs = []
    for message in _bounded(request.messages, "messages"):
        needs.append(_topic((PUBLISH,), message.topic))
        if message.system_properties.message_type == definition_pb2.TRANSACTION:
            needs.append(Need((CHECK,), PRODUCER_GROUP, _name(message.topic)))
    return needs


def _ack(request: Any) -> list[Need]:
    _bounded(request.entries, "entries")
    return _consume(request.group, request.topic)


def _telemetry(command: Any) -> list[Need]:
    if command.WhichOneof("command") != "settings":
        return []
    settings = command.settings
    which = settings.WhichOneof("pub_sub")
    if which == "publishing":
        return [_topic((PUBLISH,), t) for t in _bounded(settings.publishing.topics, "settings.publishing.topics")]
    if which == "subscription":
        entries = _bounded(settings.subscription.subscriptions, "settings.subscription.subscriptions")
        return [Need((SUBSCRIBE,), CONSUMER_GROUP, _name(settings.subscription.group)),
                *(_topic((SUBSCRIBE,), e.topic) for e in entries)]
    return []


POLICIES: Mapping[str, Policy] = {
    **{_PREFIX + name: Policy(ANY) for name in (
        "Heartbeat", "NotifyClientTermination",
        # Not served (NOT_IMPLEMENTED) but answered to any authenticated client.
        "PullMessage", "UpdateOffset", "GetOffset", "QueryOffset", "RecallMessage", "SyncLiteSubscription")},
    _PREFIX + "QueryRoute": Policy(lambda r: [_topic((PUBLISH, SUBSCRIBE), r.topic)]),
    _PREFIX + "SendMessage": Policy(_send),
    _PREFIX + "EndTransaction": Policy(lambda r: [Need((CHECK,), PRODUCER_GROUP, _name(r.topic))]),
    _PREFIX + "QueryAssignment": Policy(lambda r: _consume(r.group, r.topic)),
    _PREFIX + "ReceiveMessage": Policy(lambda r: _consume(r.group, r.message_queue.topic)),
    _PREFIX + "AckMessage": Policy(_ack),
    _PREFIX + "ChangeInvisibleDuration": Policy(lambda r: _consume(r.group, r.topic)),
    _PREFIX + "ForwardMessageToDeadLetterQueue": Policy(lambda r: _consume(r.group, r.topic)),
    _PREFIX + "Telemetry": Policy(_telemetry),
    "/grpc.health.v1.Health/Check": Policy(OPEN),
    "/grpc.health.v1.Health/Watch": Policy(OPEN),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": Policy(ANY),
}

_METHODS = service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name


def refuse(method: str, error: TxmqError) -> Any:
    """The method's own response carrying the refusal's RocketMQ status (None: not ours,
    answered with the gRPC status)."""
    described = _METHODS.get(method)
    if described is None:
        return None
    return getattr(service_pb2, described.output_type.name)(status=status(error))


AUTH_OPTIONS = {"policies": POLICIES, "refuse": refuse, "accept_signatures": True, "acts_for_callers": True}
