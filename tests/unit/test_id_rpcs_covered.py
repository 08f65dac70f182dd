"""Every RPC of every service (from the generated descriptors) whose request carries an id —
a field named like an id, a handle or a token — is accounted for (issue 30): the policy table
lists its ids for the broker to resolve and authorize, or it is for service identities only,
or the table below says why what it carries needs no lookup. A new RPC carrying an id fails
here until someone decides."""

from __future__ import annotations

import re
from typing import Any

from google.protobuf.descriptor import Descriptor

from services.common.auth.policy import INTERNAL, NATIVE
from services.proxy.access import POLICIES
from services.proxy.protocol import service_pb2
from txmq.v1 import admin_pb2, broker_pb2, checker_pb2, nameserver_pb2, operations_pb2, replication_pb2

_ID_FIELD = re.compile(r"(_id$|_ids$|handle|token|^id$)")

#: "Service/Method" → why its id-like fields need no lookup of their own.
ACCOUNTED = {
    "AdminService/DescribeTransaction": "admin-read on the whole cluster",
    "AdminService/ResolveTransaction": "admin-write on the whole cluster (an operator's decision)",
    "AdminService/ElectLeader": "a replica id; admin-write on the whole cluster",
    "AdminService/RedriveDeadLetters": "message ids looked up only in the named consumer group's DLQ "
                                       "(admin-write on that group)",
    "BrokerService/ReadQueue": "a queue id of the topic the policy checks",
    "AdminService/ResetOffsets": "queue ids of the topic named; admin-write on the consumer group",
    "AdminService/GetMessage": "admin-read on the whole cluster",
    "AdminService/ReadMessages": "a queue id of the topic the policy checks (admin-read on it)",
    "BrokerService/GetTransaction": "admin-read on the whole cluster",
    "BrokerService/QueryTransactions": "a page token is a cursor over what the policy allows to list",
    "BrokerService/GetGlobalTransaction": "admin-read on the whole cluster",
    "CheckerService/CheckTransactionState": "answers reach the broker's ReportChecks, which refuses a transaction "
                                            "not of the answering stream's group (policy: check on that group)",
    "MessagingService/SendMessage": "relayed as the client's principal: the broker refuses a message id of "
                                    "another sender (ownership.same_message)",
    "MessagingService/EndTransaction": "relayed as the client's principal with its producer group: the broker "
                                       "resolves and authorizes the transaction id",
    "MessagingService/AckMessage": "relayed as the client's principal: the broker resolves the handles",
    "MessagingService/ChangeInvisibleDuration": "relayed as the client's principal: the broker resolves the handle",
    "MessagingService/ForwardMessageToDeadLetterQueue": "relayed as the client's principal: the broker resolves "
                                                        "the handle",
    "MessagingService/ReceiveMessage": "queue and broker ids of the topic the policy checks; attempt_id unused",
    "MessagingService/Telemetry": "the id fields are of server-to-client commands, ignored from clients",
    "MessagingService/PullMessage": "not served (NOT_IMPLEMENTED)",
    "MessagingService/UpdateOffset": "not served (NOT_IMPLEMENTED)",
    "MessagingService/GetOffset": "not served (NOT_IMPLEMENTED)",
    "MessagingService/QueryOffset": "not served (NOT_IMPLEMENTED)",
    "MessagingService/RecallMessage": "not served (NOT_IMPLEMENTED)",
}


def _id_fields(desc: Descriptor, path: str = "", seen: frozenset[str] = frozenset()) -> list[str]:
    out = []
    for f in desc.fields:
        if f.message_type is not None:
            if f.message_type.full_name not in seen:
                out += _id_fields(f.message_type, f"{path}.{f.name}", seen | {f.message_type.full_name})
        elif _ID_FIELD.search(f.name):
            out.append(f"{path}.{f.name}")
    return out


def _rpcs_with_ids() -> dict[str, tuple[str, list[str]]]:
    found = {}
    for module in (admin_pb2, broker_pb2, checker_pb2, nameserver_pb2, operations_pb2, replication_pb2, service_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                fields = _id_fields(method.input_type, "", frozenset({method.input_type.full_name}))
                if fields:
                    found[f"{service.name}/{method.name}"] = (f"/{service.full_name}/{method.name}", fields)
    return found


def test_every_rpc_carrying_an_id_is_accounted_for() -> None:
    unaccounted: list[str] = []
    for rpc, (path, fields) in _rpcs_with_ids().items():
        policy: Any = NATIVE.get(path) or POLICIES.get(path)
        assert policy is not None, f"{rpc}: not in any policy table (default deny: service identities only)"
        declared = policy.rights == INTERNAL or policy.ids is not None or rpc in ACCOUNTED
        if not declared:
            unaccounted.append(f"{rpc} {fields}")
    assert not unaccounted, "RPCs carrying ids with no lookup and no reason:\n" + "\n".join(unaccounted)


def test_the_broker_resolves_the_ids_of_every_rpc_that_acts_on_them() -> None:
    with_ids = {path.rsplit("/", 1)[-1] for path, p in NATIVE.items() if p.ids is not None}
    assert with_ids == {"SendMessage", "EndTransaction", "Produce", "ReceiveMessages", "AckMessages",
                        "ChangeInvisibleDuration", "DeadLetterMessage"}
    assert set(ACCOUNTED) <= set(_rpcs_with_ids()), "a reason for an RPC that carries no id any more"
