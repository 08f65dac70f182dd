"""ACL rules: a principal, a resource (by exact name or prefix), the actions allowed on it.

Resources are written ``<type>:<name>`` — ``topic:orders`` — or ``<type>:<prefix>*`` for
every name starting with the prefix (``topic:orders-*``, ``producer_group:*``); ``cluster``
stands for every resource of every type (an operator's ``admin-read`` everywhere).

Actions: ``publish`` (send to a topic), ``subscribe`` (receive from a topic as a consumer
group: both the topic and the group need it), ``check`` (answer checks for and end the
transactions of a producer group), ``admin-read`` (list and describe transactions, topics),
``admin-write`` (create topics, resolve transactions, elect leaders). Nothing is allowed
that no rule allows; service identities (``service: true``) hold every right, and are the
only ones allowed the internal RPCs.

Namespaces: a rule with a ``namespace`` covers only that namespace's topics and groups,
its resource naming them without the namespace (``{namespace: staging, resource:
"topic:orders-*"}`` covers ``staging%orders-1``, never ``prod%orders-1``; ``cluster``
there is every topic and group of the namespace, not the cluster-wide rights, which only
a rule without a namespace grants). A rule without one matches names as they travel
(``topic:staging%orders``), so ``topic:*`` still covers every namespace.
"""

from __future__ import annotations

import dataclasses

from txmq.names import namespace_of, unqualify

PUBLISH = "publish"
SUBSCRIBE = "subscribe"
CHECK = "check"
ADMIN_READ = "admin-read"
ADMIN_WRITE = "admin-write"
ACTIONS = (PUBLISH, SUBSCRIBE, CHECK, ADMIN_READ, ADMIN_WRITE)

TOPIC = "topic"
CONSUMER_GROUP = "consumer_group"
PRODUCER_GROUP = "producer_group"
CLUSTER = "cluster"
RESOURCE_TYPES = (TOPIC, CONSUMER_GROUP, PRODUCER_GROUP, CLUSTER)


@dataclasses.dataclass(frozen=True)
class Resource:
    kind: str
    #: The exact name, or the prefix when ``prefix``; empty for the cluster.
    name: str = ""
    prefix: bool = False

    def covers(self, kind: str, name: str) -> bool:
        if self.kind == CLUSTER:
            return True
        if self.kind != kind:
            return False
        return name.startswith(self.name) if self.prefix else name == self.name

    def __str__(self) -> str:
        if self.kind == CLUSTER:
            return CLUSTER
        return f"{self.kind}:{self.name}{'*' if self.prefix else ''}"


def parse_resource(text: object) -> Resource:
    """``topic:orders``, ``topic:orders-*``, ``cluster``; ValueError says what is wrong."""
    if not isinstance(text, str) or not text:
        raise ValueError("a resource is a non-empty string")
    if text == CLUSTER:
        return Resource(CLUSTER)
    kind, sep, name = text.partition(":")
    if not sep or kind not in RESOURCE_TYPES or kind == CLUSTER:
        raise ValueError(f"{text!r}: write <type>:<name> with type one of topic, consumer_group, "
                         "producer_group, or cluster")
    prefix = name.endswith("*")
    name = name[:-1] if prefix else name
    if "*" in name or (not name and not prefix):
        raise ValueError(f"{text!r}: a name, or a prefix ending in a single '*'")
    return Resource(kind, name, prefix)


@dataclasses.dataclass(frozen=True)
class Rule:
    principal: str
    resource: Resource
    actions: frozenset[str]
    #: The namespace the rule is scoped to ("" too: the resources in none); None: unscoped.
    namespace: str | None = None

    def covers(self, kind: str, name: str) -> bool:
        if self.namespace is None:
            return self.resource.covers(kind, name)
        if kind == CLUSTER or namespace_of(name) != self.namespace:
            return False
        return self.resource.kind == CLUSTER or self.resource.covers(kind, unqualify(self.namespace, name))


def describe(kind: str, name: str) -> str:
    return CLUSTER if kind == CLUSTER else f"{kind} {name!r}"


def allows(rules: tuple[Rule, ...], principal: str, action: str, kind: str, name: str) -> bool:
    return any(r.principal == principal and action in r.actions and r.covers(kind, name)
               for r in rules)
