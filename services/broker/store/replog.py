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

On the wire a run of consecutive entries travels as one ``bytes`` field::

    +--------+--------+-------------+   repeated
    | lsn    | length | entry bytes |
    | u64 BE | u32 BE | (framed)    |
    +--------+--------+-------------+
"""

from __future__ import annotations

import struct
from typing import Iterable, Iterator

from .codec import CorruptRecordError, frame, unframe

#: The column families whose content is the shard's replicated state, in code order
#: (codes are stored: append only, never reorder). Everything else is local to a replica:
#: ``replog``/``undo``/``replica`` (replication bookkeeping) and ``walfill`` (scratch).
REPLICATED_CFS = ("log", "cq", "txn", "due", "pending", "dedup", "dedup_exp", "counters",
                  "consumers", "inflight", "topics", "meta", "timer", "global")
CF_CODES = {name: i for i, name in enumerate(REPLICATED_CFS)}

Put = tuple[str, bytes, "bytes | None"]

_HEAD = struct.Struct(">QI")
_OP = struct.Struct(">BBI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_WIRE = struct.Struct(">QI")
_EPOCH = struct.Struct(">QQ")


def lsn_key(lsn: int) -> bytes:
    return _U64.pack(lsn)


def key_lsn(key: bytes) -> int:
    return _U64.unpack(key)[0]


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
    return _U64.unpack_from(value, 5)[0]


def pack_entries(entries: Iterable[tuple[int, bytes]]) -> bytes:
    out: list[bytes] = []
    for lsn, data in entries:
        out.append(_WIRE.pack(lsn, len(data)))
        out.append(data)
    return b"".join(out)


def unpack_entries(data: bytes) -> Iterator[tuple[int, bytes]]:
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < _WIRE.size:
            raise CorruptRecordError("replication batch", b"", "truncated header")
        lsn, length = _WIRE.unpack_from(data, pos)
        pos += _WIRE.size
        if end - pos < length:
            raise CorruptRecordError("replication batch", lsn_key(lsn), "truncated entry")
        yield lsn, data[pos:pos + length]
        pos += length


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
