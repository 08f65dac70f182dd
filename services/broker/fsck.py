"""Offline check of a stopped broker's store: every record's checksum, the counters
against a recount of the transaction table, indexes against the rows they index.

    python -m services.broker.fsck --data-dir ./data/broker-0 [--broker-name broker-0] [--json]

The report also carries a digest of the replicated state (sha256 per column family):
replicas of one shard stopped at the same log end have equal digests.

Exit status 0 when consistent, 1 when a problem is found, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rocksdict import AccessType, Options, Rdict

from .config import BrokerConfig
from .core import BrokerCore
from .store import codec, replog
from .store.codec import CorruptRecordError
from .store.db import StoreInUseError


def check(core: BrokerCore) -> dict[str, Any]:
    db = core.db
    problems: list[str] = []
    counts = {"log": 0, "txn": 0, "cq": 0}
    for cf, decode in (("log", codec.decode_log_record), ("txn", codec.decode_txn), ("cq", codec.decode_cq_entry)):
        for key, value in db.scan(cf):
            counts[cf] += 1
            try:
                decode(value, key)
            except CorruptRecordError as exc:
                problems.append(str(exc))
    recount = core.recount()
    stored = {g: (c[0], c[1]) for g, c in core.counters.items()}
    for group in sorted(set(recount) | set(stored)):
        expected = recount.get(group, (0, 0))
        if stored.get(group, (0, 0)) != expected:
            problems.append(f"counters of {group!r}: stored (pending, discarded) = "
                            f"{stored.get(group, (0, 0))}, recount = {expected}")
    for index in ("due", "pending"):
        for key, _ in db.scan(index):
            group, _t, seq = codec.split_group_time_key(key)
            stored_row = db.get("txn", codec.txn_key(seq))
            row = codec.decode_txn(stored_row, key) if stored_row is not None else None
            if row is None or row.state != codec.STATE_PREPARED:
                problems.append(f"{index} index entry for seq {seq} of {group!r} but the row is "
                                f"{'missing' if row is None else codec.STATE_NAMES[row.state]}")
    problems += core.global_problems()
    seen: dict[tuple[str, int], int] = {}
    for key, value in db.scan("cq"):
        topic, queue_id, offset = codec.split_cq_key(key)
        entry = codec.decode_cq_entry(value, key)
        if topic.startswith("%"):
            continue
        previous = seen.get((topic, entry.log_seq))
        if previous is not None:
            problems.append(f"log record {entry.log_seq} appears twice in {topic!r} (offsets {previous}, {offset})")
        seen[(topic, entry.log_seq)] = offset
    local = db.cf["replica"]
    replication = {}
    lsn = local.get(b"lsn")
    if lsn is not None:
        replication = {"log_end": codec.decode_u64(lsn, "replica lsn"),
                       "epochs": replog.decode_epochs(local.get(b"epochs")),
                       "member": local.get(b"member") == b"1"}
    return {"records": counts, "counters": {g: list(c) for g, c in stored.items()},
            "recount": {g: list(c) for g, c in recount.items()}, "problems": problems,
            "digest": db.digest(), "replication": replication}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.broker.fsck", description=__doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--broker-name", default="", help="default: the name stored in the data dir")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        name = args.broker_name or _stored_name(args.data_dir)
        core = BrokerCore(BrokerConfig(data_dir=args.data_dir, broker_name=name, flush="async"))
    except StoreInUseError as exc:
        print(f"fsck: {exc}", file=sys.stderr)
        return 2
    try:
        report = check(core)
    finally:
        core.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"records: {report['records']}")
        for problem in report["problems"]:
            print(f"PROBLEM: {problem}")
        print("consistent" if not report["problems"] else f"{len(report['problems'])} problem(s)")
    return 1 if report["problems"] else 0


def _stored_name(data_dir: str) -> str:
    opts = Options(raw_mode=True)
    db = Rdict(data_dir, opts, column_families={"meta": Options(raw_mode=True)}, access_type=AccessType.read_only())
    try:
        meta = db.get_column_family("meta")
        value = meta.get(b"broker_name")
        del meta
    finally:
        db.close()
    if value is None:
        raise SystemExit(f"{data_dir} holds no txmq store")
    return codec.unframe(value, "meta").decode()


if __name__ == "__main__":
    sys.exit(main())
