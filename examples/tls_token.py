"""A cluster with TLS and authentication on (the chart's default): the client trusts the
cluster's CA and presents a bearer token; the ACL decides what its principal may do.

    python examples/tls_token.py --nameserver ns.example:9876 --ca-file ca.pem --token-file orders.token

(``--cert-file``/``--key-file`` too where the servers require client certificates: mutual
TLS, where the certificate is the identity.) Sends a transaction and consumes it, as the
asyncio flavour with ``--asyncio``. Exits 0 when the message sent came back.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

import txmq
from _common import arguments, ensure_topic
from txmq.aio import (
    AsyncSimpleConsumer,
    AsyncTransactionListener,
    AsyncTransactionProducer,
)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ca-file", required=True, help="PEM bundle of the cluster's CA")
    parser.add_argument("--cert-file", help="client certificate (mutual TLS)")
    parser.add_argument("--key-file", help="its key")
    parser.add_argument("--token-file", required=True, help="a file holding the bearer token")
    parser.add_argument("--group", default="orders", help="producer group (consumer group: GROUP-consumer)")
    parser.add_argument("--asyncio", action="store_true")


class Commit(txmq.TransactionListener):
    def execute_local_transaction(self, message, arg):
        return txmq.LocalTransactionState.COMMIT

    def check_local_transaction(self, message):
        return txmq.LocalTransactionState.COMMIT


class AsyncCommit(AsyncTransactionListener):
    async def execute_local_transaction(self, message, arg):
        return txmq.LocalTransactionState.COMMIT

    async def check_local_transaction(self, message):
        return txmq.LocalTransactionState.COMMIT


def run_sync(args: argparse.Namespace, tls: txmq.TLS, token: str, body: bytes) -> bool:
    with txmq.TransactionProducer(args.nameserver, producer_group=args.group, listener=Commit(),
                                  tls=tls, token=token) as producer:
        print("sent:", producer.send_in_transaction(txmq.Message(args.topic, body)).state)
    with txmq.SimpleConsumer(args.nameserver, consumer_group=f"{args.group}-consumer", subscriptions={args.topic: "*"},
                             await_duration_seconds=1.0, tls=tls, token=token) as consumer:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in consumer.receive(16):
                consumer.ack(m)
                if m.body == body:
                    return True
    return False


async def run_async(args: argparse.Namespace, tls: txmq.TLS, token: str, body: bytes) -> bool:
    async with AsyncTransactionProducer(args.nameserver, producer_group=args.group, listener=AsyncCommit(),
                                        tls=tls, token=token) as producer:
        print("sent:", (await producer.send_in_transaction(txmq.Message(args.topic, body))).state)
    async with AsyncSimpleConsumer(args.nameserver, consumer_group=f"{args.group}-consumer",
                                   subscriptions={args.topic: "*"}, await_duration_seconds=1.0,
                                   tls=tls, token=token) as consumer:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in await consumer.receive(16):
                await consumer.ack(m)
                if m.body == body:
                    return True
    return False


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "orders", options)
    tls = txmq.TLS(ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)
    with open(args.token_file) as fh:
        token = fh.read().strip()  # never on the command line: it would show in `ps`
    ensure_topic(args.nameserver, args.topic, tls=tls, token=token)
    body = f"over TLS {uuid.uuid4().hex[:8]}".encode()
    came_back = asyncio.run(run_async(args, tls, token, body)) if args.asyncio else run_sync(args, tls, token, body)
    print("received it back" if came_back else "not received")
    return 0 if came_back else 1


if __name__ == "__main__":
    sys.exit(main())
