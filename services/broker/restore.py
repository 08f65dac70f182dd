"""Restores a backup (``txmq broker backup``) into a stopped broker's data dir, verified
against the backup's manifest and checked with fsck (see backup.py).

    python -m services.broker.restore --from DIR --data-dir PATH [--replace] [--json]

``txmq broker restore`` runs this (the SDK never imports the services: the CLI starts
this module as a process where the services are installed, and prints the command where
they are not); it needs no name server (an init container or a one-off pod on the
broker's volume). ``--json`` prints what was restored as one JSON object. Exit status 0
restored, 1 refused (the reason on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .backup import BackupError, restore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.broker.restore", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", required=True, help="the backup directory")
    parser.add_argument("--data-dir", required=True, help="the broker's data dir (TXMQ_DATA_DIR)")
    parser.add_argument("--replace", action="store_true", help="replace a non-empty data dir (never a running broker's)")
    parser.add_argument("--json", action="store_true", help="print what was restored as a JSON object")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        r = restore(args.source, args.data_dir, replace=args.replace)
    except BackupError as exc:
        sys.stderr.write(f"restore: {exc}\n")
        return 1
    if args.json:
        sys.stdout.write(json.dumps({"data_dir": r.data_dir, "shard": r.shard, "last_log_sequence": r.last_log_sequence,
                                     "files": r.files, "bytes": r.bytes, "records": r.records}) + "\n")
        return 0
    sys.stdout.write(f"restored {r.shard} into {r.data_dir}: {r.files} file(s), {r.bytes} bytes, "
                     f"up to log sequence {r.last_log_sequence}; fsck: consistent\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
