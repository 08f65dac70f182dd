"""A producer process for the anchored-transaction crash tests: runs anchored transactions
(sync, psycopg 3), each inserting its order row and sending one message whose body is the
order id, and prints a JSON line per event. ``TXMQ_SDK_FAILPOINT`` (``txmq._anchored``)
makes it SIGKILL itself at a step; the test kills it from outside otherwise.

    python -m tests.support.anchored_worker --nameserver A --dsn D --topic T --group G
           [--orders N | --forever] [--prefix P] [--hold FILE] [--no-checks]

``--hold FILE``: each transaction waits inside its block (after its half is stored) until
FILE exists. ``--stray``: each transaction also stores a second half message with the same
key that it does not commit — what a send attempt given up on leaves behind when the send
moves to another shard (its answer was lost, yet it was stored). Events: {"ready"}, {"half": order, "transaction_id": ...},
{"committed": order, "transaction_id": ...}, {"error": order, "type": ..., "message": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nameserver", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--orders", type=int, default=1)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--prefix", default="o")
    parser.add_argument("--hold", default="")
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--stray", action="store_true")
    args = parser.parse_args()

    import dataclasses

    import psycopg

    import txmq
    from txmq.anchored import Decisions

    producer = txmq.TransactionProducer(args.nameserver, producer_group=args.group, checker_refresh_seconds=0.5,
                                        answer_checks=not args.no_checks, send_timeout_seconds=2.0,
                                        decisions=Decisions(args.dsn, repair_after_seconds=1.0,
                                                            sweep_interval_seconds=0.5))
    conn = psycopg.connect(args.dsn)
    emit(ready=True)
    n = 0
    while args.forever or n < args.orders:
        order = f"{args.prefix}-{os.getpid()}-{n}"
        n += 1
        try:
            if conn.closed or conn.broken:
                conn = psycopg.connect(args.dsn)
            with producer.transaction(conn) as tx:
                message = txmq.Message(args.topic, order.encode())
                half = tx.send(message)
                if args.stray:
                    stray = dataclasses.replace(message, properties=tx.plan.properties(message.properties))
                    left, _route = producer._send_half(stray)  # the lost attempt, stored
                    emit(stray=order, transaction_id=left.transaction_id)
                conn.execute("INSERT INTO orders (id, body) VALUES (%s, 'x')", (order,))
                if args.hold:
                    stored = half.result()
                    emit(half=order, transaction_id=stored.transaction_id)
                    while not os.path.exists(args.hold):
                        time.sleep(0.01)
            emit(committed=order, transaction_id=tx.result.messages[0].transaction_id)
        except Exception as exc:  # noqa: BLE001 - reported; the loop goes on (a fault is under test)
            emit(error=order, type=type(exc).__name__, message=str(exc)[:300])
            time.sleep(0.05)
    producer.close()
    emit(done=n)


if __name__ == "__main__":
    main()
