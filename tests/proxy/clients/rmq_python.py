"""Drives the official RocketMQ 5 Python client (``rocketmq-python-client``, unmodified)
against a txmq proxy. Run as a subprocess by tests/proxy (the client and txmq's own
modules must not share a process; see services/proxy/protocol.py).

    python rmq_python.py SCENARIO '{"endpoints": "127.0.0.1:8081", ...}'

Each scenario prints JSON lines on stdout (``{"event": ...}``) as things happen; scenarios
that run until told to stop end when stdin closes. The client's own log is under
$HOME/logs/rocketmq_python/ (tests give it a temporary HOME).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message,
                      MessageListener, Producer, PushConsumer, SimpleConsumer, TransactionChecker,
                      TransactionResolution)
from rocketmq.grpc_protocol import FilterType


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def view(m: Message) -> dict:
    body = m.body
    return {"message_id": m.message_id, "topic": m.topic, "body": body.decode() if body is not None else None,
            "tag": m.tag, "keys": sorted(m.keys or ()), "properties": dict(m.properties or {}),
            "namespace": m.namespace, "delivery_attempt": m.delivery_attempt, "corrupted": m.corrupted,
            "delivery_timestamp": m.delivery_timestamp, "received_ms": int(time.time() * 1000),
            "message_group": m.message_group}


def message(topic: str, body: str, tag: str = "", key: str = "", props: dict | None = None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body.encode()
    if tag:
        m.tag = tag
    if key:
        m.keys = key
    for k, v in (props or {}).items():
        m.add_property(k, v)
    return m


def wait_for_stdin_eof() -> None:
    sys.stdin.read()


class Checker(TransactionChecker):
    """Answers orphan checks: COMMIT unless the body says rollback (after ``hold_seconds``,
    announced by a ``checking`` event)."""

    def __init__(self, hold_seconds: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.hold_seconds = hold_seconds

    def check(self, m: Message) -> TransactionResolution:
        if self.hold_seconds:
            emit("checking", **view(m))
            time.sleep(self.hold_seconds)
        resolution = TransactionResolution.ROLLBACK if m.body.startswith(b"rollback") else TransactionResolution.COMMIT
        emit("checked", resolution="ROLLBACK" if resolution == TransactionResolution.ROLLBACK else "COMMIT",
             **view(m))
        return resolution


def config(args: dict) -> ClientConfiguration:
    """The access point, the access key and secret the client signs its requests with
    (none by default: the proxy runs with auth off), and the namespace (none by default)."""
    credentials = Credentials(args.get("access_key", ""), args.get("secret", ""))
    return ClientConfiguration(args["endpoints"], credentials, namespace=args.get("namespace", ""),
                               request_timeout=args.get("request_timeout", 3))


def tls(args: dict) -> bool:
    """``tls``: the client dials TLS (``tls_enable=True``, a client constructor's argument,
    not the configuration's). It trusts the roots gRPC trusts: the system's, or the file
    GRPC_DEFAULT_SSL_ROOTS_FILE_PATH names (the tests' CA)."""
    return bool(args.get("tls", False))


# --- scenarios ---------------------------------------------------------------------------

def transactional(args: dict) -> None:
    """For each body: a half message, then COMMIT or ROLLBACK (the body's first word), or
    neither for an "unknown" body (a local transaction whose outcome is not known yet: the
    broker's check asks ``Checker``). With an "unknown" body the producer stays up, answering
    checks, until stdin closes."""
    topic = args["topic"]
    producer = Producer(config(args), topics=[topic], checker=Checker(), tls_enable=tls(args))
    producer.startup()
    try:
        for i, body in enumerate(args["bodies"]):
            tx = producer.begin_transaction()
            receipt = producer.send(message(topic, body, tag="TagA", key=f"k{i}", props={"n": str(i)}), tx)
            emit("sent", message_id=receipt.message_id, transaction_id=receipt.transaction_id, body=body)
            if body.startswith("unknown"):
                continue
            if body.startswith("rollback"):
                tx.rollback()
            else:
                tx.commit()
            emit("ended", message_id=receipt.message_id, body=body)
        if any(body.startswith("unknown") for body in args["bodies"]):
            wait_for_stdin_eof()
    finally:
        producer.shutdown()
    emit("done")


def commit_load(args: dict) -> None:
    """``threads`` threads committing transactions in a loop (each local transaction takes
    ``local_seconds``) until a line comes on stdin: a ``committed`` event per commit, a
    ``failed`` event per exception, each with its wall-clock time ``t``. The producer then
    stays up, answering checks, until stdin closes."""
    topic = args["topic"]
    producer = Producer(config(args), topics=[topic], checker=Checker(), tls_enable=tls(args))
    producer.startup()
    stop = threading.Event()

    def work(i: int) -> None:
        n = 0
        while not stop.is_set():
            body = f"{i}-{n}"
            n += 1
            try:
                tx = producer.begin_transaction()
                receipt = producer.send(message(topic, body), tx)
                time.sleep(args.get("local_seconds", 0.0))
                tx.commit()
            except Exception as exc:  # noqa: BLE001 - reported to the test
                emit("failed", body=body, error=repr(exc)[:300], t=time.time())
                continue
            emit("committed", body=body, message_id=receipt.message_id, t=time.time())

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(args.get("threads", 4))]
    for w in workers:
        w.start()
    emit("started")
    try:
        sys.stdin.readline()
        stop.set()
        for w in workers:
            w.join(30)
        emit("stopped")
        wait_for_stdin_eof()
    finally:
        stop.set()
        producer.shutdown()
    emit("done")


def orphan(args: dict) -> None:
    """Sends a half message (``count`` of them) and dies (SIGKILL) before deciding it."""
    topic = args["topic"]
    producer = Producer(config(args), topics=[topic], checker=Checker(), tls_enable=tls(args))
    producer.startup()
    for _ in range(args.get("count", 1)):
        tx = producer.begin_transaction()
        receipt = producer.send(message(topic, args["body"], tag="TagA", key="orphan"), tx)
        emit("sent", message_id=receipt.message_id, transaction_id=receipt.transaction_id, body=args["body"])
    os.kill(os.getpid(), signal.SIGKILL)


def checker(args: dict) -> None:
    """A transactional producer that only answers checks, until stdin closes."""
    producer = Producer(config(args), topics=[args["topic"]], checker=Checker(args.get("hold_seconds", 0.0)),
                        tls_enable=tls(args))
    producer.startup()
    emit("started")
    try:
        wait_for_stdin_eof()
    finally:
        producer.shutdown()
    emit("done")


def send(args: dict) -> None:
    topic = args["topic"]
    producer = Producer(config(args), topics=[topic], tls_enable=tls(args))
    producer.startup()
    try:
        for i, body in enumerate(args["bodies"]):
            props = {"n": str(i), **args.get("props", {})}
            m = message(topic, body, tag=args.get("tag", "TagA"), key=f"k{i}", props=props)
            if args.get("groups"):  # FIFO: the message group of each body
                m.message_group = args["groups"][i]
            due = int(time.time() * 1000) + args["delay_ms"] if args.get("delay_ms") else None
            if due:
                m.delivery_timestamp = due  # ms, as the client documents it
            receipt = producer.send(m)
            emit("sent", message_id=receipt.message_id, body=body, due_ms=due)
    finally:
        producer.shutdown()
    emit("done")


def burst(args: dict) -> None:
    """``count`` concurrent ``send_async`` calls, then one ``burst`` event: how many were
    sent, the failures by exception type (with a sample message) and the message ids sent."""
    topic, count = args["topic"], args["count"]
    producer = Producer(config(args), topics=[topic], tls_enable=tls(args))
    producer.startup()
    try:
        started = time.monotonic()
        futures = [producer.send_async(message(topic, f"burst-{i}")) for i in range(count)]
        sent, failed, samples = [], {}, {}
        for future in futures:
            try:
                sent.append(future.result(timeout=args.get("timeout_seconds", 120)).message_id)
            except Exception as exc:  # noqa: BLE001 - counted by type
                name = type(exc).__name__
                failed[name] = failed.get(name, 0) + 1
                samples.setdefault(name, str(exc)[:300])
        emit("burst", sent=len(sent), failed=failed, samples=samples, message_ids=sent,
             seconds=round(time.monotonic() - started, 3))
    finally:
        producer.shutdown()


def simple(args: dict) -> None:
    """Receives until ``count`` acknowledgements. Messages whose body starts with "postpone"
    get change_invisible_duration(``postpone_seconds``) on their first delivery instead of
    an ack, and are acknowledged when redelivered. ``sql``: ``filter`` is a SQL92 expression;
    a receive that fails emits "failed" with the error and ends the scenario."""
    filter_type = FilterType.SQL if args.get("sql") else FilterType.TAG
    consumer = SimpleConsumer(config(args), args["group"],
                              {args["topic"]: FilterExpression(args.get("filter", "*"), filter_type)},
                              await_duration=args.get("await_seconds", 2), tls_enable=tls(args))
    consumer.startup()
    acked = 0
    deadline = time.monotonic() + args.get("timeout_seconds", 60)
    try:
        while acked < args["count"] and time.monotonic() < deadline:
            try:
                batch = consumer.receive(16, args.get("invisible_seconds", 10))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                emit("failed", error=f"{type(exc).__name__}: {exc}")
                break
            for m in batch:
                emit("received", **view(m))
                if m.body.startswith(b"postpone") and m.delivery_attempt == 1:
                    consumer.change_invisible_duration(m, args.get("postpone_seconds", 1))
                    emit("postponed", message_id=m.message_id)
                    continue
                consumer.ack(m)
                acked += 1
                emit("acked", message_id=m.message_id)
    finally:
        consumer.shutdown()
    emit("done", acked=acked)


class Listener(MessageListener):
    """Fails messages whose body starts with "fail", consumes the others. Messages whose
    body starts with "slow" take ``hold_seconds`` of work first (a "consuming" event marks
    the start)."""

    def __init__(self, hold_seconds: float = 0.0) -> None:
        self.hold_seconds = hold_seconds

    def consume(self, m: Message) -> ConsumeResult:
        if m.body.startswith(b"slow"):
            emit("consuming", **view(m))
            time.sleep(self.hold_seconds)  # the listener's work
        failed = m.body.startswith(b"fail")
        emit("consumed", result="FAILURE" if failed else "SUCCESS", **view(m))
        return ConsumeResult.FAILURE if failed else ConsumeResult.SUCCESS


def push(args: dict) -> None:
    consumer = PushConsumer(config(args), args["group"], Listener(args.get("hold_seconds", 0.0)),
                            {args["topic"]: FilterExpression()}, tls_enable=tls(args))
    consumer.startup()
    emit("started")
    try:
        wait_for_stdin_eof()
    finally:
        consumer.shutdown()
    emit("done")


SCENARIOS = {f.__name__: f for f in (transactional, commit_load, orphan, checker, send, burst, simple, push)}

if __name__ == "__main__":
    arguments = json.loads(sys.argv[2])
    # The client signs its requests with its host's local time labelled Z (see
    # services/common/auth/store.py): the tests say which zone it runs in, UTC by default.
    os.environ["TZ"] = arguments.get("tz", "UTC")
    time.tzset()
    try:
        SCENARIOS[sys.argv[1]](arguments)
    except Exception as exc:  # reported to the test, then the exit status says it failed
        emit("error", type=type(exc).__name__, message=str(exc)[:500], code=getattr(exc, "code", None))
        raise
