"""``txmq broker backup`` and ``txmq broker restore``: the operator's side of a broker's
online backup (OperationsService.BackupStore, served by the broker itself; the command
finds the shard's serving broker through the name server).

    txmq broker backup SHARD --to DIR
    txmq broker restore --from DIR --data-dir PATH [--replace]

A backup directory holds the store's files and, written last, ``MANIFEST.json`` (shard,
last commit-log sequence, log end, time, every file's size and sha256): a directory
without one is an unfinished backup. ``restore`` runs where the broker's code is (the
broker image, or a checkout with the services installed), on the stopped broker's data
dir: see services/broker/backup.py for what a restored broker lacks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any, Callable

import grpc

from ._errors import BrokerNotFoundError, FailedPreconditionError, InvalidArgumentError, TxmqError, error_from_rpc
from .v1 import nameserver_pb2, operations_pb2, operations_pb2_grpc

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = 1
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def serving_broker(admin: Any, shard: str) -> nameserver_pb2.BrokerInfo:
    """The broker serving ``shard`` now (its leader on a replicated shard)."""
    listed = admin.call("nameserver", "ListBrokers", nameserver_pb2.ListBrokersRequest())
    for b in listed.brokers:
        if b.name == shard and b.role != nameserver_pb2.BROKER_ROLE_FOLLOWER:
            return b
    known = sorted({b.name for b in listed.brokers})
    raise BrokerNotFoundError(shard) if shard not in known else TxmqError(
        f"shard {shard!r} has no serving leader now; try again once `txmq broker list` shows one")


def _prepare_dir(path: str) -> None:
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"--to {path}: not a directory")
        if os.listdir(path):
            raise InvalidArgumentError(f"--to {path}: not empty (a backup goes into an empty or new directory)")
    else:
        try:
            os.makedirs(path)
        except OSError as exc:
            raise InvalidArgumentError(f"--to {path}: cannot create it: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"--to {path}: not writable")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup(admin: Any, shard: str, to: str, timeout: float) -> dict[str, Any]:
    """Streams a checkpoint of ``shard``'s store into ``to`` and writes its manifest last;
    every file is checked against the sha256 the broker computed while reading it."""
    broker = serving_broker(admin, shard)
    _prepare_dir(to)
    started = time.monotonic()
    written: dict[str, tuple[int, str]] = {}
    manifest: operations_pb2.BackupManifest | None = None
    fh = None
    digest = hashlib.sha256()
    name = ""
    channel = grpc.insecure_channel(broker.address, options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)])

    def finish_file() -> None:
        nonlocal fh
        if fh is not None:
            fh.flush()
            os.fsync(fh.fileno())
            written[name] = (fh.tell(), digest.hexdigest())
            fh.close()
            fh = None
    try:
        stub = operations_pb2_grpc.OperationsServiceStub(channel)
        for response in stub.BackupStore(operations_pb2.BackupStoreRequest(), timeout=timeout):
            if response.HasField("manifest"):
                manifest = response.manifest
                continue
            chunk = response.chunk
            if chunk.file_name:
                finish_file()
                if "/" in chunk.file_name or chunk.file_name in (".", "..", MANIFEST):
                    raise TxmqError(f"the broker sent a bad file name {chunk.file_name!r}")
                name = chunk.file_name
                digest = hashlib.sha256()
                fh = open(os.path.join(to, name), "wb")
            if fh is None:
                raise TxmqError("the broker sent data before a file name")
            fh.write(chunk.data)
            digest.update(chunk.data)
        finish_file()
        if manifest is None:
            raise TxmqError("the backup stream ended without a manifest")
        expected = {f.name: (f.size, f.sha256) for f in manifest.files}
        if expected != written:
            bad = sorted(n for n in set(expected) | set(written) if expected.get(n) != written.get(n))
            raise TxmqError(f"the copy differs from what the broker read: {', '.join(bad)}")
        data = {"format": MANIFEST_FORMAT, "shard": manifest.shard, "replica_id": manifest.replica_id,
                "replication_factor": manifest.replication_factor,
                "last_log_sequence": manifest.last_log_sequence, "log_end": manifest.log_end,
                "created_at_ms": manifest.created_at_ms, "broker_address": broker.address,
                "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in manifest.files]}
        tmp = os.path.join(to, MANIFEST + ".tmp")
        with open(tmp, "w") as out:
            json.dump(data, out, indent=2)
            out.flush()
            os.fsync(out.fileno())
        os.rename(tmp, os.path.join(to, MANIFEST))
        _fsync(to)
    except grpc.RpcError as exc:
        _remove_partial(to, written, name)
        raise error_from_rpc(exc) from None
    except BaseException:
        if fh is not None:
            fh.close()
        _remove_partial(to, written, name)
        raise
    finally:
        channel.close()
    return {**data, "directory": to, "bytes": sum(s for s, _ in written.values()),
            "seconds": round(time.monotonic() - started, 3)}


def _remove_partial(to: str, written: dict[str, Any], current: str) -> None:
    for n in {*written, current} - {""}:
        try:
            os.remove(os.path.join(to, n))
        except FileNotFoundError:
            pass


def _backup_command(admin: Any, args: argparse.Namespace, out: Callable[[Any, Callable[[], str]], None]) -> None:
    data = backup(admin, args.shard, args.to, args.timeout_backup)
    out(data, lambda: (f"backed up {data['shard']} into {data['directory']}: {len(data['files'])} file(s), "
                       f"{data['bytes']} bytes in {data['seconds']:g} s; up to log sequence "
                       f"{data['last_log_sequence']} (log end {data['log_end']})"))


def _restore_command(admin: Any, args: argparse.Namespace, out: Callable[[Any, Callable[[], str]], None]) -> None:
    try:
        from services.broker.backup import BackupError, restore
    except ImportError:
        raise FailedPreconditionError(
            "restore runs where the broker's code is installed (the broker image, or `make venv`): "
            "python -m services.broker.restore") from None
    try:
        r = restore(args.source, args.data_dir, replace=args.replace)
    except BackupError as exc:
        raise FailedPreconditionError(str(exc)) from None
    data = {"data_dir": r.data_dir, "shard": r.shard, "last_log_sequence": r.last_log_sequence,
            "files": r.files, "bytes": r.bytes, "records": r.records}
    out(data, lambda: (f"restored {r.shard} into {r.data_dir} ({r.files} file(s), {r.bytes} bytes; up to log "
                       f"sequence {r.last_log_sequence}); fsck found it consistent: start the broker on it "
                       f"with TXMQ_BROKER_NAME={r.shard}"))


def add_broker_commands(broker: Any, common: argparse.ArgumentParser,
                        duration: Callable[[str], float]) -> None:
    """Adds ``backup`` and ``restore`` to the ``txmq broker`` subcommands."""
    p = broker.add_parser("backup", parents=[common], help="online backup of a shard's store into a directory")
    p.add_argument("shard", help="the shard (broker name)")
    p.add_argument("--to", required=True, help="an empty or new directory")
    p.add_argument("--backup-timeout", dest="timeout_backup", type=duration, default=600.0,
                   help="deadline of the whole copy (default 10m)")
    p.set_defaults(run=_backup_command)
    p = broker.add_parser("restore", parents=[common],
                          help="restore a backup into a stopped broker's data dir (checked with fsck)")
    p.add_argument("--from", dest="source", required=True, help="the backup directory")
    p.add_argument("--data-dir", required=True, help="the broker's data dir (TXMQ_DATA_DIR)")
    p.add_argument("--replace", action="store_true", help="replace a non-empty data dir (never a running broker's)")
    p.set_defaults(run=_restore_command)
