"""Byte layouts of the replication log: the entries a shard's leader ships to its
followers, the undo records that let a replica take back an unacknowledged tail, and the
epoch history. Pure functions: no I/O.

An *entry* is one WriteBatch of replicated state, exactly as the leader wrote it, framed
like every stored value (version, CRC32, payload; see ``codec.frame``)::

    payload: +--------+--------+-------------------------------------------------+
             | epoch  | count  | count × op                                      |
             | u64 BE | u32 BE |                                                 |
             +--------+--------+-------------------------------------------------+
    op:      +------+------+--------+-----+--------------------------+
             | cf   | kind | keylen | key | vallen + value (kind=0)  |
             | u8   | u8   | u32    |     | u32 + bytes              |
             +------+------+--------+-----+--------------------------+

``cf`` is the column family's code in :data:`REPLICATED_CFS`, ``kind`` 0 = put,
1 = delete. An *undo record* has the same layout (epoch 0): the values its entry's keys
had before it (a delete where a key was absent), so applying it puts the state back.

On the wire (the ENTRIES frame below) a run of consecutive entries travels each with its
undo record::

    +--------+--------+-----------+-------------+------------+   repeated
    | lsn    | length | undo len  | entry bytes | undo bytes |
    | u64 BE | u32 BE | u32 BE    | (framed)    | (framed)   |
    +--------+--------+-----------+-------------+------------+

The undo record is the leader's own, computed when it wrote the entry (it read the keys'
before-images then). A follower stores it as it comes instead of reading every key's
before-image from its own store: replicas hold equal state at every lsn (the same entries
applied in the same order to the same starting state, the log-matching rule of the epoch
truncation), so the leader's before-images are the follower's. An undo length of 0 means
"no undo record": the leader sends none for an entry at or below the commit point the
frame carries (it may have dropped it already, and nobody takes such an entry back); a
follower refuses an entry above that point without one.
"""

from __future__ import annotations

import struct
from typing import Iterable, Iterator

from .codec import CorruptRecordError, frame, unframe

#: The column families whose content is the shard's replicated state, in code order
#: (codes are stored: append only, never reorder). Everything else is local to a replica:
#: ``replog``/``undo``/``replica`` (replication bookkeeping) and ``walfill`` (scratch).
REPLICATED_CFS = ("log", "cq", "txn", "due", "pending", "dedup", "dedup_exp", "counters",
                  "consumers", "inflight", "topics", "meta", "timer", "global", "keys")
CF_CODES = {name: i for i, name in enumerate(REPLICATED_CFS)}

Put = tuple[str, bytes, "bytes | None"]

_HEAD = struct.Struct(">QI")
_OP = struct.Struct(">BBI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_WIRE = struct.Struct(">QII")
_EPOCH = struct.Struct(">QQ")


def lsn_key(lsn: int) -> bytes:
    return _U64.pack(lsn)


def key_lsn(key: bytes) -> int:
    decoded: int = _U64.unpack(key)[0]
    return decoded


def encode_entry(epoch: int, puts: Iterable[Put]) -> bytes:
    parts: list[bytes] = []
    count = 0
    codes = CF_CODES
    for cf, key, value in puts:
        count += 1
        if value is None:
            parts.append(_OP.pack(codes[cf], 1, len(key)))
            parts.append(key)
        else:
            parts.append(_OP.pack(codes[cf], 0, len(key)))
            parts.append(key)
            parts.append(_U32.pack(len(value)))
            parts.append(value)
    return frame(_HEAD.pack(epoch, count) + b"".join(parts))


def decode_entry(value: bytes, key: bytes = b"") -> tuple[int, list[Put]]:
    """(epoch, the entry's puts in order; a ``None`` value is a delete)."""
    payload = unframe(value, "replication entry", key)
    try:
        epoch, count = _HEAD.unpack_from(payload)
        pos = _HEAD.size
        puts: list[Put] = []
        for _ in range(count):
            code, kind, klen = _OP.unpack_from(payload, pos)
            pos += _OP.size
            k = payload[pos:pos + klen]
            pos += klen
            if kind == 0:
                (vlen,) = _U32.unpack_from(payload, pos)
                pos += _U32.size
                puts.append((REPLICATED_CFS[code], k, payload[pos:pos + vlen]))
                pos += vlen
            elif kind == 1:
                puts.append((REPLICATED_CFS[code], k, None))
            else:
                raise ValueError(f"op kind {kind}")
        if pos != len(payload):
            raise ValueError(f"{len(payload) - pos} trailing bytes")
    except (struct.error, IndexError, ValueError) as exc:
        raise CorruptRecordError("replication entry", key, str(exc)) from None
    return epoch, puts


def entry_epoch(value: bytes) -> int:
    """The epoch of an encoded entry (header only; its CRC is checked when decoded)."""
    decoded: int = _U64.unpack_from(value, 5)[0]
    return decoded


def pack_entries(entries: Iterable[tuple[int, bytes, bytes]]) -> bytes:
    """(lsn, entry, undo record or b"") triples in the wire layout above."""
    out: list[bytes] = []
    for lsn, data, undo in entries:
        out.append(_WIRE.pack(lsn, len(data), len(undo)))
        out.append(data)
        out.append(undo)
    return b"".join(out)


def unpack_entries(data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """(lsn, entry, undo record or b"") of each entry in ``data`` (:func:`pack_entries`)."""
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < _WIRE.size:
            raise CorruptRecordError("replication batch", b"", "truncated header")
        lsn, length, undo_length = _WIRE.unpack_from(data, pos)
        pos += _WIRE.size
        if end - pos < length + undo_length:
            raise CorruptRecordError("replication batch", lsn_key(lsn), "truncated entry")
        yield lsn, data[pos:pos + length], data[pos + length:pos + length + undo_length]
        pos += length + undo_length


def encode_epochs(epochs: list[tuple[int, int]]) -> bytes:
    """The epoch history: (epoch, first lsn written in it), ascending."""
    return frame(b"".join(_EPOCH.pack(e, s) for e, s in epochs))


def decode_epochs(value: bytes | None) -> list[tuple[int, int]]:
    if value is None:
        return []
    payload = unframe(value, "epoch history", b"epochs")
    if len(payload) % _EPOCH.size:
        raise CorruptRecordError("epoch history", b"epochs", "length is not a multiple of 16")
    return [_EPOCH.unpack_from(payload, i) for i in range(0, len(payload), _EPOCH.size)]


def epoch_end(epochs: list[tuple[int, int]], epoch: int, log_end: int) -> tuple[int, int]:
    """Kafka's OffsetsForLeaderEpoch on an epoch history: the largest epoch ≤ ``epoch``
    that this history knows and the last lsn written in it (the lsn before the next
    epoch's first, or ``log_end`` for the newest). (0, 0) when it knows none."""
    found = (0, 0)
    for i, (e, _start) in enumerate(epochs):
        if e > epoch:
            break
        end = epochs[i + 1][1] - 1 if i + 1 < len(epochs) else log_end
        found = (e, end)
    return found


def follower_truncation(epochs: list[tuple[int, int]], log_end: int, truncate_to: int, end_epoch: int) -> int:
    """Where a follower truncates, given its own epoch history and log end and its leader's
    answer: ``truncate_to``, the leader's end of ``end_epoch`` (the largest epoch not newer
    than the follower's last that the leader knows). Kafka's second round of
    OffsetsForLeaderEpoch: when the follower also wrote in epochs newer than ``end_epoch``
    (it led them, or followed a leader of them, and the leader never heard of them), its
    entries past its own end of ``end_epoch`` are not the leader's even below
    ``truncate_to``: it truncates to the smaller of the two ends."""
    _epoch, own_end = epoch_end(epochs, end_epoch, log_end)
    return min(truncate_to, own_end)


# --- the replication stream's frames (``transport.py``) ------------------------------------
#
# A follower's session with its leader is one TCP connection (TLS when the brokers have
# certificates) carrying length-prefixed frames::
#
#     +--------+------+------------------+
#     | length | kind | body             |
#     | u32 BE | u8   | length - 1 bytes |
#     +--------+------+------------------+
#
# follower → leader:
#   HELLO      version u8 | replica_id u32 | leader_epoch u64 | log_end u64 | last_epoch u64
#              | shard s16 | token s16 (a bearer token, empty with mTLS or auth off)
#   ACK        durable_lsn u64 (the follower's log is fsynced up to here)
# leader → follower (``epoch``: the leader's; ``commit``: its commit point):
#   START      epoch u64 | commit u64 | truncate_to u64 | end_epoch u64   (the first answer
#              to a hello; end_epoch: the epoch truncate_to ends, see follower_truncation)
#   ENTRIES    epoch u64 | commit u64 | consecutive entries with their undo records (the
#              wire layout above)
#   HEARTBEAT  epoch u64 | commit u64
#   CHECKPOINT epoch u64 | commit u64   (fetch a checkpoint: the log cannot continue)
# either way:
#   REFUSED    code u8 (a gRPC status code) | message (UTF-8); the connection then closes
#
# The entries keep their own CRC (``frame``); TCP (and TLS) protect the rest.

HELLO, ACK, START, ENTRIES, HEARTBEAT, CHECKPOINT, REFUSED = 1, 2, 3, 4, 5, 6, 7
KIND_NAMES = {HELLO: "hello", ACK: "ack", START: "start", ENTRIES: "entries", HEARTBEAT: "heartbeat",
              CHECKPOINT: "checkpoint", REFUSED: "refused"}
#: The hello's version byte: what this code speaks. 2: entries carry their undo records
#: (a leader refuses a version-1 follower with a message naming both versions: the replicas
#: of a shard run one version of the broker).
STREAM_VERSION = 2
FRAME_HEAD = struct.Struct(">IB")
_HELLO = struct.Struct(">BIQQQ")
_LEADER = struct.Struct(">QQ")
_START = struct.Struct(">QQQQ")
_U16 = struct.Struct(">H")


class FrameError(ValueError):
    """A frame that does not follow the layout; the message says what is wrong."""


def _frame(kind: int, body: bytes) -> bytes:
    return FRAME_HEAD.pack(len(body) + 1, kind) + body


def _s16(text: str, what: str) -> bytes:
    data = text.encode()
    if len(data) > 0xFFFF:
        raise FrameError(f"{what} is {len(data)} bytes, more than 65535")
    return _U16.pack(len(data)) + data


def encode_hello(shard: str, replica_id: int, leader_epoch: int, log_end: int, last_epoch: int,
                 token: str = "") -> bytes:
    return _frame(HELLO, _HELLO.pack(STREAM_VERSION, replica_id, leader_epoch, log_end, last_epoch)
                  + _s16(shard, "shard") + _s16(token, "token"))


def decode_hello(body: bytes) -> tuple[str, int, int, int, int, str]:
    """(shard, replica_id, leader_epoch, log_end, last_epoch, token)."""
    try:
        version, replica_id, epoch, log_end, last_epoch = _HELLO.unpack_from(body)
        if version != STREAM_VERSION:
            raise FrameError(f"hello version {version}, this broker speaks {STREAM_VERSION}")
        pos = _HELLO.size
        texts = []
        for _ in range(2):
            (n,) = _U16.unpack_from(body, pos)
            pos += _U16.size
            if pos + n > len(body):
                raise FrameError("hello: a string runs past the frame")
            texts.append(body[pos:pos + n].decode())
            pos += n
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"hello: {exc}") from None
    if pos != len(body):
        raise FrameError(f"hello: {len(body) - pos} trailing bytes")
    return texts[0], replica_id, epoch, log_end, last_epoch, texts[1]


def encode_ack(durable_lsn: int) -> bytes:
    return _frame(ACK, _U64.pack(durable_lsn))


def decode_ack(body: bytes) -> int:
    if len(body) != _U64.size:
        raise FrameError(f"ack: {len(body)} bytes, not 8")
    decoded: int = _U64.unpack(body)[0]
    return decoded


def encode_start(epoch: int, commit: int, truncate_to: int, end_epoch: int) -> bytes:
    return _frame(START, _START.pack(epoch, commit, truncate_to, end_epoch))


def start_end_epoch(body: bytes) -> int:
    """The epoch a START frame's truncation point ends (its body already checked by
    :func:`decode_leader`)."""
    decoded: int = _START.unpack(body)[3]
    return decoded


def encode_entries(epoch: int, commit: int, entries: Iterable[tuple[int, bytes, bytes]]) -> bytes:
    """One ENTRIES frame of (lsn, entry, undo record or b"") triples, built with a single
    join (the entries are not copied twice)."""
    parts: list[bytes] = [b"", _LEADER.pack(epoch, commit)]
    append = parts.append
    wire = _WIRE.pack
    size = _LEADER.size + 1
    for lsn, data, undo in entries:
        append(wire(lsn, len(data), len(undo)))
        append(data)
        append(undo)
        size += _WIRE.size + len(data) + len(undo)
    parts[0] = FRAME_HEAD.pack(size, ENTRIES)
    return b"".join(parts)


def encode_heartbeat(epoch: int, commit: int) -> bytes:
    return _frame(HEARTBEAT, _LEADER.pack(epoch, commit))


def encode_checkpoint_needed(epoch: int, commit: int) -> bytes:
    return _frame(CHECKPOINT, _LEADER.pack(epoch, commit))


def decode_leader(kind: int, body: bytes) -> tuple[int, int, int, bytes]:
    """A leader's frame: (epoch, commit, truncate_to (START) or 0, entries (ENTRIES) or b"")."""
    if kind == START:
        if len(body) != _START.size:
            raise FrameError(f"start: {len(body)} bytes, not {_START.size}")
        epoch, commit, truncate_to, _end_epoch = _START.unpack(body)
        return epoch, commit, truncate_to, b""
    if kind not in (ENTRIES, HEARTBEAT, CHECKPOINT):
        raise FrameError(f"frame kind {kind} is not one a leader sends")
    if len(body) < _LEADER.size or (kind != ENTRIES and len(body) != _LEADER.size):
        raise FrameError(f"{KIND_NAMES[kind]}: {len(body)} bytes")
    epoch, commit = _LEADER.unpack_from(body)
    return epoch, commit, 0, body[_LEADER.size:]


def encode_refused(code: int, message: str) -> bytes:
    return _frame(REFUSED, bytes((code & 0xFF,)) + message.encode()[:4096])


def decode_refused(body: bytes) -> tuple[int, str]:
    if not body:
        raise FrameError("refused: empty")
    return body[0], body[1:].decode(errors="replace")
