"""Operating shards: online backup and restore, draining a shard, and adding one to a
topic. ``backup`` and ``drain`` speak OperationsService, served by the broker itself (the
command finds the shard's serving broker, its leader on a replicated shard, through the
name server); ``topic expand`` is the name server's AdminService.ExpandTopic.

    txmq broker backup SHARD --to DIR
    txmq broker restore --from DIR --data-dir PATH [--replace]
    txmq broker drain SHARD [--wait 5m] [--status] [--undo]
    txmq topic expand TOPIC --broker SHARD [--queues N]

``drain`` refuses the last shard (not draining) of any of its topics: expand the topic onto
another shard first. With ``--wait`` it returns once the shard is empty (nothing pending,
every consumer group done with its queues) and says it can be removed, or fails at the
deadline saying what remains.

A backup directory holds the store's files and, written last, ``MANIFEST.json`` (shard,
last commit-log sequence, log end, time, every file's size and sha256): a directory
without one is an unfinished backup. ``restore`` runs where the broker's code is (the
broker image, or a checkout with the services installed), on the stopped broker's data
dir: see services/broker/backup.py for what a restored broker lacks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any, Callable

import grpc

from .backup import MANIFEST, MANIFEST_FORMAT
from ._errors import BrokerNotFoundError, FailedPreconditionError, InvalidArgumentError, TxmqError, error_from_rpc
from .v1 import admin_pb2, nameserver_pb2, operations_pb2, operations_pb2_grpc

_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def serving_broker(admin: Any, shard: str) -> nameserver_pb2.BrokerInfo:
    """The broker serving ``shard`` now (its leader on a replicated shard)."""
    listed: nameserver_pb2.ListBrokersResponse = admin.call("nameserver", "ListBrokers",
                                                            nameserver_pb2.ListBrokersRequest())
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
            os.makedirs(path, mode=0o700)  # its owner's alone: see _private
        except OSError as exc:
            raise InvalidArgumentError(f"--to {path}: cannot create it: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"--to {path}: not writable")


def _private(path: str, mode: str = "wb") -> Any:
    """A new file of the backup, readable by its owner only whatever the umask: a backup
    holds every message of the shard and the store's id secret, as the credential files
    hold tokens (``services.common.auth bootstrap`` writes those 0600 too)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), mode)


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
    channel, stub = _operations(admin, broker.address)

    def finish_file() -> None:
        nonlocal fh
        if fh is not None:
            fh.flush()
            os.fsync(fh.fileno())
            written[name] = (fh.tell(), digest.hexdigest())
            fh.close()
            fh = None
    try:
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
                fh = _private(os.path.join(to, name))
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
        with _private(tmp, "w") as out:
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


def _operations(admin: Any, address: str) -> tuple[grpc.Channel, operations_pb2_grpc.OperationsServiceStub]:
    """A broker's OperationsService, over the admin client's TLS and token."""
    channel = admin.channel_to(address, _MAX_MESSAGE_BYTES)
    return channel, operations_pb2_grpc.OperationsServiceStub(channel)


def status_dict(s: operations_pb2.DrainStatus) -> dict[str, Any]:
    return {"shard": s.shard, "draining": s.draining, "pending_transactions": s.pending_transactions,
            "discarded_transactions": s.discarded_transactions,
            "backlog": [{"consumer_group": b.consumer_group, "topic": b.topic, "unacknowledged": b.unacknowledged}
                        for b in s.backlog if b.unacknowledged],
            "unread_topics": list(s.unread_topics), "topics": {t.topic: t.queue_count for t in s.topics},
            "empty": s.empty}


def _status_text(d: dict[str, Any]) -> str:
    if d["empty"]:
        return (f"{d['shard']} is drained and empty: it can be removed (nothing pending, every consumer group "
                f"done with its queues)")
    state = "draining" if d["draining"] else "not draining"
    left = [f"{d['pending_transactions']} pending transaction(s)", f"{d['discarded_transactions']} discarded"]
    left += [f"{b['unacknowledged']} unacknowledged for {b['consumer_group']} on {b['topic']}" for b in d["backlog"]]
    if d["unread_topics"]:
        left.append(f"messages no consumer group read on {', '.join(d['unread_topics'])}")
    return f"{d['shard']} is {state}; left: " + "; ".join(left)


def _last_shard_topics(admin: Any, shard: str) -> list[str]:
    """Topics of ``shard`` that no other live, non-draining shard holds queues of."""
    listed = admin.call("nameserver", "ListBrokers", nameserver_pb2.ListBrokersRequest()).brokers
    mine = next(b for b in listed if b.name == shard)
    elsewhere = {t.topic for b in listed if b.name != shard and not b.draining for t in b.topics if t.queue_count}
    return sorted(t.topic for t in mine.topics if t.queue_count and t.topic not in elsewhere)


def drain(admin: Any, shard: str, *, wait: float, undo: bool, status_only: bool, timeout: float) -> dict[str, Any]:
    broker = serving_broker(admin, shard)
    if not undo and not status_only:
        last = _last_shard_topics(admin, shard)
        if last:
            raise FailedPreconditionError(
                f"{shard} is the last shard (not draining) of topic(s) {', '.join(last)}: its messages would have "
                f"nowhere to go; add another shard first (txmq topic expand TOPIC --broker OTHER)",
                shard=shard, topics=last)
    channel, stub = _operations(admin, broker.address)
    try:
        try:
            if status_only:
                status = stub.GetDrainStatus(operations_pb2.GetDrainStatusRequest(), timeout=timeout).status
            else:
                status = stub.SetDraining(operations_pb2.SetDrainingRequest(draining=not undo), timeout=timeout).status
            deadline = time.monotonic() + wait
            while wait and not status.empty and status.draining and time.monotonic() < deadline:
                time.sleep(0.2)
                status = stub.GetDrainStatus(operations_pb2.GetDrainStatusRequest(), timeout=timeout).status
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
    finally:
        channel.close()
    data = status_dict(status)
    if wait and status.draining and not status.empty:
        raise TxmqError(f"not empty after {wait:g} s: " + _status_text(data), **data)
    return data


def _drain_command(admin: Any, args: argparse.Namespace, out: Callable[[Any, Callable[[], str]], None]) -> None:
    data = drain(admin, args.shard, wait=args.wait or 0.0, undo=args.undo, status_only=args.status,
                 timeout=getattr(args, "timeout", 10.0))
    out(data, lambda: _status_text(data))


def _expand_command(admin: Any, args: argparse.Namespace, out: Callable[[Any, Callable[[], str]], None]) -> None:
    response = admin.call("admin", "ExpandTopic", admin_pb2.ExpandTopicRequest(
        topic=args.topic, broker_name=args.broker, queue_count=args.queues))
    data = {"topic": response.topic, "brokers": {b.broker_name: b.queue_count for b in response.brokers}}
    out(data, lambda: f"{data['topic']}: " + ", ".join(f"{b} {n} queue(s)" for b, n in sorted(data["brokers"].items()))
        + f" (producers send to {args.broker} from their next route refresh)")


def _backup_command(admin: Any, args: argparse.Namespace, out: Callable[[Any, Callable[[], str]], None]) -> None:
    data = backup(admin, args.shard, args.to, args.timeout_backup)
    out(data, lambda: (f"backed up {data['shard']} into {data['directory']}: {len(data['files'])} file(s), "
                       f"{data['bytes']} bytes in {data['seconds']:g} s; up to log sequence "
                       f"{data['last_log_sequence']} (log end {data['log_end']})"))


#: The services' restore, which ``txmq broker restore`` runs (the SDK never imports services).
RESTORE_MODULE = "services.broker.restore"


def restore_command(source: str, data_dir: str, replace: bool) -> list[str]:
    """The command that restores ``source`` into ``data_dir`` where the services are installed."""
    return [sys.executable, "-m", RESTORE_MODULE, "--from", source, "--data-dir", data_dir,
            *(["--replace"] if replace else []), "--json"]


def services_installed() -> bool:
    """Whether the services' code is importable here (looked up, not imported)."""
    spec = importlib.util.find_spec("services")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return any(os.path.exists(os.path.join(d, "broker", "restore.py")) for d in locations)


def _restore_command(admin: Any, args: argparse.Namespace, out: Callable[[Any, Callable[[], str]], None]) -> None:
    command = restore_command(args.source, args.data_dir, args.replace)
    if not services_installed():
        raise FailedPreconditionError(
            "restore runs where the broker's code is installed (the broker image, or `make venv`): "
            + " ".join(shlex.quote(a) for a in ["python", "-m", *command[2:-1]]))
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        reason = done.stderr.strip().removeprefix("restore: ") or f"{RESTORE_MODULE} exited with {done.returncode}"
        raise FailedPreconditionError(reason)
    data = json.loads(done.stdout)
    out(data, lambda: (f"restored {data['shard']} into {data['data_dir']} ({data['files']} file(s), "
                       f"{data['bytes']} bytes; up to log sequence {data['last_log_sequence']}); fsck found it "
                       f"consistent: start the broker on it with TXMQ_BROKER_NAME={data['shard']}"))


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
    p = broker.add_parser("drain", parents=[common],
                          help="stop new sends to a shard, let it empty, say when it can be removed")
    p.add_argument("shard", help="the shard (broker name)")
    p.add_argument("--wait", type=duration, default=0.0, help="wait until it is empty (e.g. 5m); fail at the deadline")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="only report (change nothing)")
    what.add_argument("--undo", action="store_true", help="end draining: the shard takes new sends again")
    p.set_defaults(run=_drain_command)


def add_topic_commands(topic: Any, common: argparse.ArgumentParser) -> None:
    """Adds ``expand`` to the ``txmq topic`` subcommands."""
    p = topic.add_parser("expand", parents=[common], help="add a topic's queues on another shard (no recreation)")
    p.add_argument("topic")
    p.add_argument("--broker", required=True, help="the shard to add queues on")
    p.add_argument("--queues", type=int, default=0,
                   help="queues on that shard (default: as many as the most any shard of the topic holds)")
    p.set_defaults(run=_expand_command)
