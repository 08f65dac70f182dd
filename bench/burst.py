"""Bursts of concurrent sends (issue 13 item 6): what comes back, and what is stored.

    python -m bench.burst [--count 5000] [--only raw,rawproxy,sdk,aio,proxy] [--produce-limit N]

Starts a name server, a broker and a proxy with their default settings (a topic of two
queues), then three bursts of ``--count`` sends started at once, each to a topic of its own:

- ``raw``: unary ``SendMessage`` calls to the broker on one grpc.aio channel (no retries):
  each call's status;
- ``rawproxy``: the same to the proxy in the RocketMQ protocol (status in band);
- ``sdk``: ``--count`` threads of one native ``txmq.Producer`` calling ``send`` at once:
  sends that raised to the application;
- ``aio``: ``--count`` concurrent ``send`` coroutines of one ``txmq.aio.AsyncProducer``;
  sends that raised to the application. The SDKs' sends ride the broker's Produce stream,
  which sheds sends beyond ``max_pending_produce_entries`` in band (OVERLOADED per entry;
  ``--produce-limit`` sets it to show the SDKs backing off) and the SDKs send them again;
- ``proxy``: the official RocketMQ Python client's ``send_async``, ``--count`` futures at
  once (a subprocess, as tests/proxy drive it): futures that failed to the application.

For each it prints the census of outcomes and the messages stored in the topic (read back
from the broker): 0 CANCELLED and stored == sent is the goal. Before this change a 2,000-call
burst came back 181/2,000 CANCELLED to the broker and 197 through the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _stored(cluster: Any, topic: str) -> int:
    from txmq.v1 import broker_pb2, broker_pb2_grpc
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[0].address))
    offsets = stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic=topic), timeout=10)
    return sum(q.max_offset - q.min_offset for q in offsets.queues)


async def _raw(address: str, topic: str, count: int) -> collections.Counter[str]:
    import grpc

    from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2
    async with grpc.aio.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)

        async def one() -> str:
            try:
                await stub.SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
                    topic=topic, body=b"burst")), timeout=120)
                return "OK"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
        return collections.Counter(await asyncio.gather(*(one() for _ in range(count))))


async def _raw_proxy(address: str, topic: str, count: int) -> collections.Counter[str]:
    """The same as ``_raw`` in the RocketMQ protocol: ``SendMessage`` to the proxy, the
    status in band (``rmq <code>``) or the call's."""
    import grpc

    from services.proxy.protocol import Code, definition_pb2, service_pb2, service_pb2_grpc
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        async def one(i: int) -> str:
            request = service_pb2.SendMessageRequest(messages=[definition_pb2.Message(
                topic=definition_pb2.Resource(name=topic), body=b"burst",
                system_properties=definition_pb2.SystemProperties(
                    message_id=f"raw-{topic}-{i}", message_type=definition_pb2.NORMAL))])
            try:
                response = await stub.SendMessage(request, timeout=120, metadata=(("x-mq-client-id", "bench"),))
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return "OK" if response.status.code == Code.OK else f"rmq {response.status.code}"
        return collections.Counter(await asyncio.gather(*(one(i) for i in range(count))))


def _sdk(nameserver: str, topic: str, count: int) -> collections.Counter[str]:
    import txmq
    outcomes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    go = threading.Event()
    with txmq.Producer(nameserver) as producer:
        def one(i: int) -> None:
            go.wait()
            try:
                producer.send(txmq.Message(topic, f"burst-{i}".encode()))
                outcome = "OK"
            except txmq.TxmqError as exc:
                outcome = f"{type(exc).__name__} ({exc.code.name})"
            with lock:
                outcomes[outcome] += 1
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
    return outcomes


def _aio(nameserver: str, topic: str, count: int) -> collections.Counter[str]:
    import txmq
    from txmq.aio import AsyncProducer

    async def burst() -> collections.Counter[str]:
        async with AsyncProducer(nameserver) as producer:
            async def one(i: int) -> str:
                try:
                    await producer.send(txmq.Message(topic, f"burst-{i}".encode()))
                    return "OK"
                except txmq.TxmqError as exc:
                    return f"{type(exc).__name__} ({exc.code.name})"
            return collections.Counter(await asyncio.gather(*(one(i) for i in range(count))))
    return asyncio.run(burst())


def _produce_shed(cluster: Any) -> int:
    from tests.support.metrics import metric_sum
    return int(metric_sum(cluster.brokers[0].metrics_port, "txmq_produce_entries_shed_total"))


def _proxy(proxy: str, topic: str, count: int, home: Path) -> tuple[collections.Counter[str], dict[str, str], int]:
    from tests.proxy.support import Clients
    clients = Clients(home)
    try:
        client = clients.python("burst", timeout=600, endpoints=proxy, topic=topic, count=count)
        (event,) = client.wait_event("burst", timeout=600)
    finally:
        clients.close()
    outcomes = collections.Counter({"OK": event["sent"], **event["failed"]})
    return outcomes, event["samples"], len(set(event["message_ids"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--only", default="raw,rawproxy,sdk,aio,proxy")
    parser.add_argument("--produce-limit", type=int, default=0,
                        help="the broker's max_pending_produce_entries in the 'now' set-up (0: its default)")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the same bursts against gRPC's own queue sizing (the behaviour before)")
    args = parser.parse_args(argv)
    phases = args.only.split(",")
    setups = [("now: queue sized, excess shed (defaults)", {})]
    if not args.no_compare:
        # What the services did before: gRPC's pending cap (1,000) and no shedding.
        setups.insert(0, ("before: gRPC's pending cap of 1,000, no shedding",
                          {"TXMQ_MAX_PENDING_RPCS": "1000", "TXMQ_MAX_CONCURRENT_RPCS": "1000000"}))
    failed = False
    for title, env in setups:
        print(f"--- {title}", flush=True)
        now = not env
        produce = {"TXMQ_MAX_PENDING_PRODUCE_ENTRIES": str(args.produce_limit)} if now and args.produce_limit else {}
        failed |= _run(phases, args.count, env, produce) and now
    return 1 if failed else 0


def _run(phases: list[str], count: int, env: dict[str, str], broker_env: dict[str, str]) -> bool:
    """The bursts against a fresh cluster whose services get ``env`` (the broker also
    ``broker_env``); True if one failed."""
    from tests.support.cluster import Cluster
    from txmq.v1 import admin_pb2

    workdir = Path(tempfile.mkdtemp(prefix="txmq-bench-burst-"))
    failed = False
    args = argparse.Namespace(count=count)
    with Cluster(workdir, proxies=1, nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true", **env},
                 broker_env={**env, **broker_env}, proxy_env=env) as cluster:
        for phase in phases:
            topic = f"burst-{phase}-{int(time.time())}"
            cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=2), timeout=10)
            started = time.monotonic()
            shed_before = _produce_shed(cluster)
            extra = ""
            if phase == "raw":
                outcomes = asyncio.run(_raw(cluster.brokers[0].address, topic, args.count))
            elif phase == "rawproxy":
                outcomes = asyncio.run(_raw_proxy(cluster.proxy_addresses[0], topic, args.count))
            elif phase == "sdk":
                outcomes = _sdk(cluster.nameserver_address, topic, args.count)
            elif phase == "aio":
                outcomes = _aio(cluster.nameserver_address, topic, args.count)
            elif phase == "proxy":
                outcomes, samples, distinct = _proxy(cluster.proxy_addresses[0], topic, args.count, workdir / "home")
                extra = f"; distinct message ids {distinct}" + (f"; samples {samples}" if samples else "")
            else:
                raise SystemExit(f"unknown phase {phase!r}")
            elapsed = time.monotonic() - started
            stored = _stored(cluster, topic)
            lost = args.count - outcomes.get("OK", 0) if phase in ("sdk", "aio", "proxy") else 0
            if phase in ("sdk", "aio"):
                extra = f"; sends the broker shed in band (retried) {_produce_shed(cluster) - shed_before}"
            print(f"{phase:>5}: {args.count} concurrent sends in {elapsed:.2f} s: {dict(outcomes)}; "
                  f"stored {stored}; CANCELLED {outcomes.get('CANCELLED', 0)}; "
                  f"lost to the application {lost}{extra}", flush=True)
            failed |= outcomes.get("CANCELLED", 0) > 0 or lost > 0 or \
                (phase in ("sdk", "aio", "proxy") and stored != args.count)
    return failed


if __name__ == "__main__":
    sys.exit(main())
