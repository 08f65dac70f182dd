"""Restores a backup (``txmq broker backup``) into a stopped broker's data dir, verified
against the backup's manifest and checked with fsck (see backup.py).

    python -m services.broker.restore --from DIR --data-dir PATH [--replace]

The same as ``txmq broker restore``; this form needs no name server (an init container or
a one-off pod on the broker's volume). Exit status 0 restored, 1 refused, 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .backup import BackupError, restore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.broker.restore", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", required=True, help="the backup directory")
    parser.add_argument("--data-dir", required=True, help="the broker's data dir (TXMQ_DATA_DIR)")
    parser.add_argument("--replace", action="store_true", help="replace a non-empty data dir (never a running broker's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        r = restore(args.source, args.data_dir, replace=args.replace)
    except BackupError as exc:
        sys.stderr.write(f"restore: {exc}\n")
        return 1
    sys.stdout.write(f"restored {r.shard} into {r.data_dir}: {r.files} file(s), {r.bytes} bytes, "
                     f"up to log sequence {r.last_log_sequence}; fsck: consistent\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
