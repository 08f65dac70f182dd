"""Fuzzing the replication port of a replicated shard (``services/broker/transport.py``),
the leader's and a follower's: ``tests/integration/test_replication_fuzz.py`` runs a small
budget, ``make fuzz`` (``python -m tests.fuzz --replication N``) a large one.

Each example is one connection carrying what hypothesis draws: well-typed frames (a hello
whose every field comes from the extremes and the real values — the shard, the replica
ids, the leader's epoch, a log end past the leader's —, acks of any lsn, the frames only a
leader sends, unknown kinds, REFUSED), the same frames cut short or with bytes added, a
header announcing a huge frame, or raw bytes; one to three of them, then the client
half-closes and reads what comes back. The census counts the outcomes per target.

The property, per connection: the broker answers a refusal with a code other than
INTERNAL/UNKNOWN and a message, or the protocol's own frames (a hello it accepts), or
closes quietly on an incomplete frame — never a silence, never an error of its own (its
log gets no ``replication session failed``). Afterwards (the caller's part): every replica
still runs and serves, the shard is back in sync, and the replicas are equal and clean
under fsck.
"""

from __future__ import annotations

import collections
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.broker.store import replog

from .replstream import replication_address, split_frames

#: Refusal codes that would mean the broker failed (its own error), not the input.
FORBIDDEN = frozenset({grpc.StatusCode.INTERNAL.value[0], grpc.StatusCode.UNKNOWN.value[0]})
_CODES = {c.value[0]: c.name for c in grpc.StatusCode}
_U64_EDGES = [0, 1, 2, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1]
_WORDS = ["", "x", "broker-1", "é" * 3, "\x00", "y" * 300]


@dataclass
class Shard:
    """What the fuzzed shard really has, so generated frames also reach past the checks."""

    name: str
    replication_factor: int
    epoch: int
    log_end: int


@dataclass
class Census:
    counts: dict[str, collections.Counter[str]] = field(default_factory=lambda: collections.defaultdict(
        collections.Counter))
    failures: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, target: str, outcome: str, failure: str | None) -> None:
        self.counts[target][outcome] += 1
        if failure:
            self.failures[f"{target}: {failure}"] += 1

    def calls(self, target: str) -> int:
        return sum(self.counts[target].values())

    def table(self) -> str:
        lines = []
        for target, counter in sorted(self.counts.items()):
            lines.append(f"{target}: " + ", ".join(f"{k} {v}" for k, v in counter.most_common()))
        return "\n".join(lines)


def _u64(shard: Shard) -> st.SearchStrategy[int]:
    real = [shard.epoch, shard.epoch - 1, shard.epoch + 1, shard.log_end, shard.log_end + 1, shard.log_end + 10**6]
    return st.one_of(st.sampled_from([v for v in _U64_EDGES + real if 0 <= v < 2**64]),
                     st.integers(0, 2**64 - 1))


def _frame(kind: int, body: bytes) -> bytes:
    return replog.FRAME_HEAD.pack(len(body) + 1, kind) + body


@st.composite
def frames(draw: Callable[..., Any], shard: Shard) -> bytes:
    """One frame, well-typed or not."""
    choice = draw(st.sampled_from(["hello", "hello", "session", "session", "ack", "leader", "unknown", "refused",
                                   "huge", "raw", "broken"]))
    if choice == "session":  # a hello the leader accepts (a replica of the shard, its epoch)
        return replog.encode_hello(shard.name, draw(st.integers(0, shard.replication_factor - 1)), shard.epoch,
                                   draw(_u64(shard)), draw(st.sampled_from([0, shard.epoch, 2**64 - 1])))
    if choice == "hello":
        replica = draw(st.one_of(st.sampled_from([*range(shard.replication_factor + 1), 2**32 - 1]),
                                 st.integers(0, 2**32 - 1)))
        name = draw(st.one_of(st.just(shard.name), st.sampled_from(_WORDS)))
        token = draw(st.sampled_from(["", "a-token-nobody-has", "z" * 5000]))
        return replog.encode_hello(name, replica, draw(_u64(shard)), draw(_u64(shard)), draw(_u64(shard)), token)
    if choice == "ack":
        return replog.encode_ack(draw(_u64(shard)))
    if choice == "leader":
        kind = draw(st.sampled_from([replog.START, replog.ENTRIES, replog.HEARTBEAT, replog.CHECKPOINT]))
        body = struct.pack(">QQ", draw(_u64(shard)), draw(_u64(shard))) + draw(st.binary(max_size=64))
        return _frame(kind, body)
    if choice == "unknown":
        return _frame(draw(st.sampled_from([0, 8, 9, 127, 255])), draw(st.binary(max_size=64)))
    if choice == "refused":
        return _frame(replog.REFUSED, draw(st.binary(max_size=32)))
    if choice == "huge":  # a header announcing more than any frame may hold
        return replog.FRAME_HEAD.pack(draw(st.sampled_from([0, 2**16 + 1, 2**26, 2**32 - 1])), replog.HELLO)
    if choice == "raw":
        return draw(st.binary(min_size=1, max_size=2048))
    # "broken": a well-typed hello cut short or with bytes added
    hello = replog.encode_hello(shard.name, 1, shard.epoch, shard.log_end, shard.epoch)
    cut = draw(st.integers(1, len(hello) - 1))
    if draw(st.booleans()):
        return hello[:cut]
    extra = draw(st.binary(min_size=1, max_size=16))
    return replog.FRAME_HEAD.pack(len(hello) - 4 + len(extra), replog.HELLO) + hello[5:] + extra


def connection_bytes(shard: Shard) -> st.SearchStrategy[list[bytes]]:
    return st.lists(frames(shard), min_size=1, max_size=3)


def _complete_frames(data: bytes) -> bool:
    """Whether ``data`` starts with at least one whole frame of an allowed size."""
    if len(data) < replog.FRAME_HEAD.size:
        return False
    length, _kind = replog.FRAME_HEAD.unpack_from(data)
    return length < 1 or length > 2**16 or len(data) >= 4 + length


def exchange(address: tuple[str, int], data: bytes, timeout: float) -> tuple[list[tuple[int, bytes]], str]:
    """Sends ``data``, half-closes, reads frames: (frames, how it ended: closed / reset /
    silent / more, the last when it kept sending — a session the broker accepted)."""
    frames_in: list[tuple[int, bytes]] = []
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return frames_in, "reset"
        buffer = b""
        while len(frames_in) < 6:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return frames_in, "silent"
            except OSError:
                return frames_in, "reset"
            if not chunk:
                return frames_in, "closed"
            buffer = split_frames(buffer + chunk, frames_in)
    return frames_in, "more"


def judge(data: bytes, got: list[tuple[int, bytes]], ended: str) -> tuple[str, str | None]:
    """(the outcome for the census, a failure or None)."""
    for kind, body in got:
        if kind == replog.REFUSED:
            code, message = body[0] if body else -1, body[1:].decode(errors="replace")
            name = _CODES.get(code, f"code {code}")
            if code in FORBIDDEN or not message:
                return f"refused {name}", f"refused {name} {message!r}"
            return f"refused {name}", None
    if got:
        kinds = {replog.KIND_NAMES.get(k, str(k)) for k, _ in got}
        if not kinds <= {"start", "entries", "heartbeat", "checkpoint"}:
            return f"frames {sorted(kinds)}", f"unexpected frames {sorted(kinds)}"
        return "session " + "/".join(sorted(kinds)), None
    if ended == "silent":
        return "silent", f"no answer and no close to {data[:40].hex()}…"
    if _complete_frames(data) and ended != "reset":
        return f"{ended} without a refusal", f"a complete frame {data[:40].hex()}… closed without a refusal"
    return ended, None


def fuzz(targets: dict[str, tuple[str, int]], shard: Shard, examples: int, census: Census,
         timeout: float = 5.0) -> None:
    """``examples`` connections to each target (name → host, port)."""
    for name, address in targets.items():
        @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck))
        @given(connection_bytes(shard))
        def one(parts: list[bytes]) -> None:
            data = b"".join(parts)
            got, ended = exchange(address, data, timeout)
            outcome, failure = judge(data, got, ended)
            census.add(name, outcome, failure)
        one()


def run_on_cluster(cluster: Any, examples: int, census: Census, topic: str = "fuzz-replicated") -> dict[str, Any]:
    """The whole scenario on a running replicated ``cluster`` (shard ``broker-0``): messages
    before and after, ``examples`` connections to the leader's and a follower's port, then
    the checks of the module's property. Returns a report; asserts nothing (the callers do)."""
    import txmq

    from .replicas import stop_and_compare, wait_in_sync

    leader = cluster.wait_leaders()["broker-0"]
    follower = next(p for p in cluster.shards["broker-0"] if p is not leader)
    cluster.create_topic(topic, 2)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for i in range(20):
            producer.send(txmq.Message(topic, b"before %d" % i))
    info = {b.name: b for b in cluster.list_brokers()}["broker-0"]
    shard = Shard("broker-0", len(cluster.shards["broker-0"]), info.leader_epoch, info.replication.log_end)
    logs = {p.name: p.log_path.stat().st_size for p in cluster.shards["broker-0"]}
    fuzz({"leader": replication_address(leader), "follower": replication_address(follower)}, shard, examples, census)
    errors = []
    for proc in cluster.shards["broker-0"]:
        with open(proc.log_path, "rb") as fh:
            fh.seek(logs[proc.name])
            errors += [f"{proc.name}: {line[:300]!r}" for line in fh if b'"ERROR"' in line or b'"CRITICAL"' in line]
    running = {p.name: p.running for p in cluster.shards["broker-0"]}
    with txmq.Producer(cluster.nameserver_address) as producer:
        for i in range(20):
            producer.send(txmq.Message(topic, b"after %d" % i))
    still_leader = cluster.leader("broker-0") is leader
    wait_in_sync(cluster, "broker-0", replicas=shard.replication_factor, timeout=60)
    reports = stop_and_compare(cluster, "broker-0")  # asserts equal digests and clean fsck
    return {"errors": errors, "running": running, "still_leader": still_leader,
            "log_end": reports[0]["replication"]["log_end"]}
