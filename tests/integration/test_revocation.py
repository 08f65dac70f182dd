"""A right revoked by a credentials reload stops what the principal does on the calls it
already holds open, on a real cluster with auth on (name server, broker, checker; the
credential file rewritten while they run): the checker's check stream (checks carry the half
messages' bodies), a broker long poll, a broker Produce stream. Each test failed before the
services decided held calls again (docs/security.md, "Revoking")."""

from __future__ import annotations

import copy
import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

import txmq
from services.common.auth import hash_token
from tests.support.cluster import Cluster
from tests.support.metrics import metric
from tests.support.waiting import wait_until
from txmq.v1 import (admin_pb2, broker_pb2, broker_pb2_grpc, checker_pb2, checker_pb2_grpc, common_pb2,
                     operations_pb2, operations_pb2_grpc)

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
SERVICES = ("nameserver", "broker", "checker")
#: A second checker's identity (no process: the tests claim with it).
CLAIMER = "claimer"
PEOPLE = ("operator", "alice", "bob", "carol", "dave", "erin", "ops")
TOKENS = {name: f"revocation-token-{name}-0123456789abcdef" for name in (*SERVICES, CLAIMER, *PEOPLE)}
BASE_ACL = [
    {"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write", "subscribe"]},
    # alice answers the checks of two groups; bob sends every group's halves and may answer them.
    {"principal": "alice", "resource": "producer_group:rv-a", "actions": ["check"]},
    {"principal": "alice", "resource": "producer_group:rv-b", "actions": ["check"]},
    {"principal": "alice", "resource": "producer_group:rv-d", "actions": ["check"]},
    {"principal": "alice", "resource": "producer_group:rv-e", "actions": ["check"]},
    {"principal": "alice", "resource": "producer_group:rv-f", "actions": ["check"]},
    {"principal": "alice", "resource": "producer_group:rv-g", "actions": ["check"]},
    {"principal": "bob", "resource": "topic:rv", "actions": ["publish"]},
    {"principal": "bob", "resource": "topic:lp", "actions": ["publish"]},
    {"principal": "bob", "resource": "producer_group:rv-*", "actions": ["check"]},
    {"principal": "carol", "resource": "producer_group:rv-c", "actions": ["check"]},
    {"principal": "dave", "resource": "topic:lp", "actions": ["subscribe"]},
    {"principal": "dave", "resource": "consumer_group:lpg", "actions": ["subscribe"]},
    {"principal": "erin", "resource": "topic:rv", "actions": ["publish"]},
    {"principal": "ops", "resource": "cluster", "actions": ["admin-read"]},
]
RELOAD = {"TXMQ_AUTH_RELOAD_SECONDS": "0.2"}


def credentials(tokens: dict[str, str] = TOKENS, acl: list[dict[str, Any]] = BASE_ACL,
                absent: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"principals": {name: {"service": name in (*SERVICES, CLAIMER), "tokens": [hash_token(token)]}
                           for name, token in tokens.items() if name not in absent},
            "acl": [rule for rule in acl if rule["principal"] not in absent]}


def without(principal: str, resource: str, action: str) -> list[dict[str, Any]]:
    """The base ACL without ``action`` on ``resource`` for ``principal``."""
    acl = copy.deepcopy(BASE_ACL)
    for rule in acl:
        if rule["principal"] == principal and rule["resource"] == resource:
            rule["actions"] = [a for a in rule["actions"] if a != action]
    return [rule for rule in acl if rule["actions"]]


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # as a Secret update swaps the file


_CHANNELS: dict[str, grpc.Channel] = {}


def plain_channel(address: str) -> grpc.Channel:
    """A channel carrying no credentials of its own (the cluster's carry the operator's)."""
    if address not in _CHANNELS:
        _CHANNELS[address] = grpc.insecure_channel(address)
    return _CHANNELS[address]


def bearer(who: str, tokens: dict[str, str] = TOKENS) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {tokens[who]}")]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    workdir = tmp_path_factory.mktemp("revocation")
    creds = workdir / "credentials.json"
    write_json(creds, credentials())
    env: dict[str, dict[str, str]] = {}
    for service in SERVICES:
        token_file = workdir / f"{service}.token"
        token_file.write_text(TOKENS[service] + "\n")
        env[service] = {"TXMQ_AUTH_FILES": str(creds), "TXMQ_AUTH_TOKEN_FILE": str(token_file), **RELOAD}
    # Checks due 0.5 s after a half and not again for a minute; a check a producer neither
    # starts nor answers comes back by itself only after 30 s (the answer timeout).
    cluster = Cluster(workdir, nameserver_env={**env["nameserver"], "TXMQ_AUTO_CREATE_TOPICS": "false"},
                      broker_env={**env["broker"], "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.5",
                                  "TXMQ_CHECK_INTERVAL_SECONDS": "60", "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "60"},
                      checker=True, checker_env={**env["checker"], "TXMQ_BROKER_REFRESH_SECONDS": "0.5",
                                                 "TXMQ_ANSWER_TIMEOUT_SECONDS": "30", "TXMQ_LEASE_SECONDS": "60"},
                      token=TOKENS["operator"])
    try:
        cluster.create_topic("rv", queue_count=1)
        cluster.create_topic("lp", queue_count=1)
        yield cluster, creds
    finally:
        cluster.stop()


@pytest.fixture
def creds(secured: tuple[Cluster, Path]) -> Iterator[Path]:
    """The credential file, written back as it was after the test; every service reads it on
    its next call once TXMQ_AUTH_RELOAD_SECONDS have passed since its last look."""
    yield secured[1]
    write_json(secured[1], credentials())
    time.sleep(3 * float(RELOAD["TXMQ_AUTH_RELOAD_SECONDS"]))


class Unknown(txmq.TransactionListener):
    def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        return txmq.LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: Any) -> Any:
        return txmq.LocalTransactionState.UNKNOWN


def send_half(cluster: Cluster, group: str, body: bytes) -> str:
    """A pending transaction of ``group`` (bob's), its first check due 0.5 s later."""
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=Unknown(),
                                  answer_checks=False, token=TOKENS["bob"]) as producer:
        return producer.send_in_transaction(txmq.Message("rv", body)).transaction_id


def describe(cluster: Cluster, transaction_id: str) -> common_pb2.Transaction:
    return cluster.admin_stub().DescribeTransaction(admin_pb2.DescribeTransactionRequest(
        transaction_id=transaction_id), timeout=RPC_TIMEOUT).transaction


class CheckStream:
    """A producer's CheckTransactionState stream on the wire: what it sends, what it got."""

    def __init__(self, cluster: Cluster, who: str, groups: list[str], tokens: dict[str, str] = TOKENS) -> None:
        self.outbox: queue.Queue[checker_pb2.CheckTransactionStateRequest | None] = queue.Queue()
        self.inbox: queue.Queue[checker_pb2.CheckTransactionStateResponse] = queue.Queue()
        self.got: list[checker_pb2.CheckTransactionStateResponse] = []
        self.ended: grpc.RpcError | None = None
        self.done = threading.Event()
        self.send(checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
            producer_groups=groups, client_id=f"{who}-stream", check_credit=8)))
        stub = checker_pb2_grpc.CheckerServiceStub(plain_channel(cluster.checkers[0].address))
        self.call = stub.CheckTransactionState(self._requests(), metadata=bearer(who, tokens), timeout=150)
        threading.Thread(target=self._read, daemon=True).start()
        self.next("subscribed")

    def send(self, request: checker_pb2.CheckTransactionStateRequest) -> None:
        self.outbox.put(request)

    def _requests(self) -> Iterator[checker_pb2.CheckTransactionStateRequest]:
        while (item := self.outbox.get()) is not None:
            yield item

    def _read(self) -> None:
        try:
            for response in self.call:
                self.got.append(response)
                self.inbox.put(response)
        except grpc.RpcError as exc:
            self.ended = exc
        finally:
            self.done.set()

    def next(self, kind: str, timeout: float = 15.0) -> Any:
        while True:
            try:
                response = self.inbox.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {kind} on the stream in {timeout} s (got {self.got})") from None
            if response.WhichOneof("command") == kind:
                return getattr(response, kind)

    def checked(self) -> list[str]:
        """The transactions of every check the stream was sent."""
        return [r.check.transaction_id for r in self.got if r.HasField("check")]

    def end_status(self, timeout: float = 10.0) -> tuple[grpc.StatusCode, str]:
        assert self.done.wait(timeout), f"the stream is still open after {timeout} s (got {self.got})"
        assert self.ended is not None
        return self.ended.code(), self.ended.details() or ""

    def close(self) -> None:
        self.outbox.put(None)
        self.call.cancel()


def test_a_revoked_group_leaves_an_open_check_stream(secured: tuple[Cluster, Path], creds: Path) -> None:
    """alice's stream serves rv-a and rv-b. Her check right on rv-a is revoked: the stream is
    told so (PERMISSION_DENIED naming rv-a), her answer to the rv-a check she holds is refused,
    that check goes back to the broker at once with nothing spent and reaches bob (allowed),
    and rv-a's later checks go to bob only while rv-b's still reach her. With rv-b revoked too
    the stream ends PERMISSION_DENIED naming it. Before the fix her stream kept receiving
    rv-a's checks — the half messages' bodies — until she subscribed again."""
    cluster, _ = secured
    alice = CheckStream(cluster, "alice", ["rv-a", "rv-b"])
    bob: CheckStream | None = None
    try:
        held_txn = send_half(cluster, "rv-a", b"held by alice")
        held = alice.next("check")
        assert held.transaction_id == held_txn and held.message.body == b"held by alice"

        write_json(creds, credentials(acl=without("alice", "producer_group:rv-a", "check")))
        told = alice.next("error")
        assert told.reason == "PERMISSION_DENIED" and "'rv-a'" in told.message, told
        alice.send(checker_pb2.CheckTransactionStateRequest(answer=checker_pb2.CheckAnswer(
            check_id=held.check_id, result=common_pb2.CHECK_RESULT_COMMIT)))
        assert alice.next("error").reason == "INVALID_FIELD"  # not a check of hers any more
        assert describe(cluster, held_txn).state == common_pb2.TRANSACTION_STATE_PREPARED

        bob = CheckStream(cluster, "bob", ["rv-a"])
        assert bob.next("check").transaction_id == held_txn  # at once: not after the 30 s timeout
        assert describe(cluster, held_txn).checks_delivered == 0  # handed back, nothing spent

        later_a = send_half(cluster, "rv-a", b"for bob only")
        later_b = send_half(cluster, "rv-b", b"still alice's")
        assert bob.next("check").transaction_id == later_a
        assert alice.next("check").transaction_id == later_b
        assert alice.checked() == [held_txn, later_b]

        write_json(creds, credentials(acl=[r for r in without("alice", "producer_group:rv-a", "check")
                                            if r["resource"] != "producer_group:rv-b"]))
        code, details = alice.end_status()
        assert code == grpc.StatusCode.PERMISSION_DENIED and "'rv-b'" in details, details
    finally:
        alice.close()
        if bob is not None:
            bob.close()


def test_a_check_right_granted_again_brings_the_group_back_to_the_open_stream(secured: tuple[Cluster, Path],
                                                                             creds: Path) -> None:
    """alice's stream serves rv-f and rv-g. Her check right on rv-f is revoked (the stream is
    told) and a half of rv-f sent meanwhile is not checked through her: nobody serves rv-f,
    its check stays due. The right is granted again: that check, and a later half's, reach
    her on the same stream, which never subscribed again; rv-g's still do. Failed before:
    the stream stayed without rv-f until its producer subscribed again."""
    cluster, _ = secured
    alice = CheckStream(cluster, "alice", ["rv-f", "rv-g"])
    try:
        write_json(creds, credentials(acl=without("alice", "producer_group:rv-f", "check")))
        told = alice.next("error")
        assert told.reason == "PERMISSION_DENIED" and "'rv-f'" in told.message, told
        meanwhile = send_half(cluster, "rv-f", b"sent while revoked")
        with pytest.raises(AssertionError, match="no check on the stream"):
            alice.next("check", timeout=3.0)  # due 0.5 s after its send: not for alice now

        write_json(creds, credentials())
        assert alice.next("check").transaction_id == meanwhile
        later = send_half(cluster, "rv-f", b"after the grant")
        assert alice.next("check").transaction_id == later
        still = send_half(cluster, "rv-g", b"the other group")
        assert alice.next("check").transaction_id == still
        assert [r.WhichOneof("command") for r in alice.got].count("subscribed") == 1 and not alice.done.is_set()
    finally:
        alice.close()


@pytest.mark.parametrize("revoked", ["token", "principal"])
def test_a_check_stream_ends_when_its_credentials_go(secured: tuple[Cluster, Path], creds: Path,
                                                     revoked: str) -> None:
    """carol's token is rotated away (or carol is removed): her open check stream ends
    UNAUTHENTICATED, and a check of her group that comes due afterwards is not sent to her.
    Before the fix the stream, authenticated once, stayed open and was sent it."""
    cluster, _ = secured
    carol = CheckStream(cluster, "carol", ["rv-c"])
    try:
        if revoked == "token":
            write_json(creds, credentials(tokens={**TOKENS, "carol": "a-rotated-token-0123456789abcdef"}))
        else:
            write_json(creds, credentials(absent=("carol",)))
        code, details = carol.end_status()
        assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
        after = send_half(cluster, "rv-c", b"not for carol")
        assert after not in carol.checked()
    finally:
        carol.close()


def _waiting(cluster: Cluster, group: str) -> bool:
    stub = broker_pb2_grpc.BrokerServiceStub(plain_channel(cluster.brokers[0].address))
    clients = stub.DescribeGroupClients(broker_pb2.DescribeGroupClientsRequest(group=group), timeout=RPC_TIMEOUT,
                                        metadata=bearer("nameserver")).clients
    return any(c.waiting for c in clients)


def test_a_long_poll_held_across_a_revoke_hands_out_nothing(secured: tuple[Cluster, Path], creds: Path) -> None:
    """dave waits in a long poll of lp; his subscribe right on lp is revoked; a message sent
    afterwards is not delivered to him (the poll ends PERMISSION_DENIED) and stays for an
    allowed consumer, first delivery. Before the fix the poll, authorized when it began,
    handed him the message."""
    cluster, _ = secured
    stub = broker_pb2_grpc.BrokerServiceStub(plain_channel(cluster.brokers[0].address))
    outcome: list[Any] = []

    def poll() -> None:
        try:
            outcome.append(stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
                consumer_group="lpg", topic="lp", queue_id=-1, max_messages=4, invisible_duration_seconds=30.0,
                long_polling_timeout_seconds=25.0), metadata=bearer("dave"), timeout=40))
        except grpc.RpcError as exc:
            outcome.append(exc)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    wait_until(lambda: _waiting(cluster, "lpg"), 15.0, message="dave's long poll waiting at the broker")
    write_json(creds, credentials(acl=without("dave", "topic:lp", "subscribe")))

    def refused() -> bool:
        try:
            stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic="lp"), metadata=bearer("dave"),
                                 timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.PERMISSION_DENIED
        return False
    wait_until(refused, 15.0, message="the broker to read the revoke")
    assert _waiting(cluster, "lpg"), "the long poll ended before the message came"
    with txmq.Producer(cluster.nameserver_address, token=TOKENS["bob"]) as producer:
        producer.send(txmq.Message("lp", b"not for dave"))
    poller.join(30)
    assert len(outcome) == 1
    assert isinstance(outcome[0], grpc.RpcError), f"dave's poll was answered: {outcome[0]}"
    assert outcome[0].code() == grpc.StatusCode.PERMISSION_DENIED, outcome[0]
    # Still there for a consumer that may read it, on its first delivery.
    got = wait_until(lambda: stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
        consumer_group="lpg", topic="lp", queue_id=-1, max_messages=4, invisible_duration_seconds=30.0),
        metadata=bearer("operator"), timeout=RPC_TIMEOUT).messages, 10.0, message="the message for the operator")
    assert [(m.message.body, m.delivery_attempt) for m in got] == [(b"not for dave", 1)]


def test_a_produce_stream_ends_when_its_token_is_revoked(secured: tuple[Cluster, Path], creds: Path) -> None:
    """erin sends on a Produce stream; her token is revoked; her next send on the same open
    stream is refused (UNAUTHENTICATED) and not stored. Before the fix the stream, authenticated
    once, kept sending for her."""
    cluster, _ = secured
    stub = broker_pb2_grpc.BrokerServiceStub(plain_channel(cluster.brokers[0].address))
    outbox: queue.Queue[broker_pb2.ProduceRequest | None] = queue.Queue()

    def entry(request_id: int, body: bytes) -> broker_pb2.ProduceRequest:
        return broker_pb2.ProduceRequest(entries=[broker_pb2.ProduceEntry(
            request_id=request_id, send_message=broker_pb2.SendMessageRequest(message=common_pb2.Message(
                topic="rv", body=body, type=common_pb2.MESSAGE_TYPE_NORMAL)))])

    def requests() -> Iterator[broker_pb2.ProduceRequest]:
        while (item := outbox.get()) is not None:
            yield item

    def stored() -> int:
        offsets = stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic="rv"), metadata=bearer("operator"),
                                       timeout=RPC_TIMEOUT)
        return sum(q.max_offset for q in offsets.queues)

    call = stub.Produce(requests(), metadata=bearer("erin"), timeout=60)
    try:
        outbox.put(entry(1, b"before"))
        first = next(call)
        assert first.results[0].status.code == 0, first
        before = stored()
        write_json(creds, credentials(tokens={**TOKENS, "erin": "a-rotated-token-0123456789abcdef"}))

        def revoked() -> bool:
            try:
                stub.GetBrokerStats(broker_pb2.GetBrokerStatsRequest(), metadata=bearer("erin"), timeout=RPC_TIMEOUT)
            except grpc.RpcError as exc:
                return exc.code() == grpc.StatusCode.UNAUTHENTICATED
            return False
        wait_until(revoked, 15.0, message="the broker to read the revoke")
        outbox.put(entry(2, b"after"))
        with pytest.raises(grpc.RpcError) as ended:
            answered = next(call)
            pytest.fail(f"the send after the revoke was answered: {answered}")
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value
        assert stored() == before
    finally:
        outbox.put(None)
        call.cancel()


def test_a_backup_held_across_a_revoke_streams_no_more_of_the_store(secured: tuple[Cluster, Path],
                                                                    creds: Path) -> None:
    """ops reads the first chunk of a backup (the store: every message and the id secret),
    then its admin-read is revoked: the rest of the backup is refused (PERMISSION_DENIED), no
    manifest comes. The store is ~20 MiB, far more than gRPC lets the broker write ahead of a
    reader. Before the fix the backup, authorized when it began, streamed to its end."""
    cluster, _ = secured
    with txmq.Producer(cluster.nameserver_address, token=TOKENS["bob"]) as producer:
        for _ in range(40):
            producer.send(txmq.Message("rv", os.urandom(512 * 1024)))
    operations = operations_pb2_grpc.OperationsServiceStub(plain_channel(cluster.brokers[0].address))
    call = operations.BackupStore(operations_pb2.BackupStoreRequest(), metadata=bearer("ops"), timeout=60)
    try:
        assert next(call).HasField("chunk")
        write_json(creds, credentials(acl=without("ops", "cluster", "admin-read")))

        def refused() -> bool:
            try:
                operations.GetDrainStatus(operations_pb2.GetDrainStatusRequest(), metadata=bearer("ops"),
                                          timeout=RPC_TIMEOUT)
            except grpc.RpcError as exc:
                return exc.code() == grpc.StatusCode.PERMISSION_DENIED
            return False
        wait_until(refused, 15.0, message="the broker to read the revoke")
        with pytest.raises(grpc.RpcError) as ended:
            for response in call:
                assert not response.HasField("manifest"), "the whole backup reached ops after the revoke"
        assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED, ended.value
    finally:
        call.cancel()


def test_an_answer_for_a_group_the_stream_lost_is_refused_in_band(secured: tuple[Cluster, Path],
                                                                   creds: Path) -> None:
    """alice's stream serves rv-d and rv-e; her check right on rv-d is revoked while she
    holds an rv-d check. Her answer to it naming its group and transaction (as the SDK and
    the proxy answer) is refused in band (an error naming the check, PERMISSION_DENIED) and
    decides nothing, counted under rv-d as refused for the revoke (reason "revoked"); the
    stream goes on serving rv-e. Before the fix the stream policy refused the answer and
    ended the whole stream, for rv-e too; then the refusal was counted "invalid", under rv-e."""
    cluster, _ = secured
    port = cluster.checkers[0].metrics_port

    def refusals(group: str, reason: str) -> float | None:
        return metric(port, "txmq_check_answers_refused_total", {"group": group, "reason": reason})
    alice = CheckStream(cluster, "alice", ["rv-d", "rv-e"])
    assert refusals("rv-d", "revoked") == 0  # exported at 0 from the group's first producer
    try:
        held_txn = send_half(cluster, "rv-d", b"answered too late")
        held = alice.next("check")
        assert held.transaction_id == held_txn

        write_json(creds, credentials(acl=without("alice", "producer_group:rv-d", "check")))
        assert alice.next("error").reason == "PERMISSION_DENIED"
        alice.send(checker_pb2.CheckTransactionStateRequest(answer=checker_pb2.CheckAnswer(
            check_id=held.check_id, result=common_pb2.CHECK_RESULT_COMMIT, transaction_id=held_txn,
            broker_name=held.broker_name, producer_group="rv-d")))
        refused = alice.next("error")
        assert refused.reason == "PERMISSION_DENIED" and "'rv-d'" in refused.message, refused
        assert json.loads(refused.details["check_id"]) == held.check_id
        assert describe(cluster, held_txn).state == common_pb2.TRANSACTION_STATE_PREPARED
        assert refusals("rv-d", "revoked") == 1
        assert refusals("rv-e", "invalid") == 0 and not refusals("rv-d", "invalid")  # rv-d's went with its stream

        later_b = send_half(cluster, "rv-e", b"still alice's")
        assert alice.next("check").transaction_id == later_b
        assert not alice.done.is_set(), alice.ended
    finally:
        alice.close()


def test_an_answer_for_a_group_the_stream_never_held_still_ends_it(secured: tuple[Cluster, Path]) -> None:
    """An answer naming a group the stream's principal may not check and the stream never
    subscribed (someone else's checks) is refused by the stream policy: the stream ends
    PERMISSION_DENIED naming the group, as before."""
    cluster, _ = secured
    alice = CheckStream(cluster, "alice", ["rv-a"])
    try:
        alice.send(checker_pb2.CheckTransactionStateRequest(answer=checker_pb2.CheckAnswer(
            check_id="0" * 24, result=common_pb2.CHECK_RESULT_COMMIT, transaction_id="forged",
            broker_name="broker-0", producer_group="rv-c")))
        code, details = alice.end_status()
        assert code == grpc.StatusCode.PERMISSION_DENIED and "'rv-c'" in details, (code, details)
    finally:
        alice.close()


def test_a_claim_held_across_a_checker_identitys_removal_claims_nothing(secured: tuple[Cluster, Path],
                                                                       creds: Path) -> None:
    """A checker identity's ClaimChecks waits at the broker (nothing of rv-z due); the identity
    is removed; a half of rv-z ends the wait: the claim ends UNAUTHENTICATED and takes no lease
    on the check, which the group's producer is then checked for through the running checker
    as soon as it is due. Fails without the broker's re-check after the claim's wait: the held
    claim, authorized when it began, is answered."""
    cluster, _ = secured
    stub = broker_pb2_grpc.BrokerServiceStub(plain_channel(cluster.brokers[0].address))

    def claim(wait_ms: int, groups: bool = True) -> Any:
        return broker_pb2.ClaimChecksRequest(
            session_id="rv-held", groups_version=1, checker_id="claimer-0", max_checks=4, lease_seconds=60.0,
            groups=[broker_pb2.ClaimGroup(producer_group="rv-z", max_checks=4)] if groups else [], wait_ms=wait_ms)

    def holding() -> bool:  # the held claim's session exists: it was authorized and claimed once
        return not stub.ClaimChecks(claim(0, groups=False), metadata=bearer(CLAIMER),
                                    timeout=RPC_TIMEOUT).groups_needed

    def refused() -> bool:
        try:
            holding()
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.UNAUTHENTICATED
        return False

    # Any check coming due sooner ends every held claim's wait (the previous tests' checks
    # going back do): the claim is held again until one is held across the revoke.
    for _ in range(5):
        held = stub.ClaimChecks.future(claim(30_000), metadata=bearer(CLAIMER), timeout=40)
        wait_until(holding, 15.0, message="the claim to be held at the broker")
        write_json(creds, credentials(absent=(CLAIMER,)))
        wait_until(refused, 15.0, message="the broker to read the removal")
        if not held.done() or held.exception() is not None:
            break  # held across the removal (and maybe woken after it)
        write_json(creds, credentials())
        wait_until(lambda: not refused(), 15.0, message="the broker to read the identity back")
    else:
        pytest.fail("no claim was held across the removal")
    txn = send_half(cluster, "rv-z", b"not for a removed checker")
    error = held.exception(timeout=15)
    assert isinstance(error, grpc.RpcError), f"the held claim was answered: {held.result()}"
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
    # No lease was taken: the check reaches an allowed producer as soon as it is due.
    bob = CheckStream(cluster, "bob", ["rv-z"])
    try:
        assert bob.next("check").transaction_id == txn
    finally:
        bob.close()
