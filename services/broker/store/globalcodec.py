"""Byte layouts of the multi-message transaction rows (column family ``global``). Pure
functions: no I/O. Values are framed like every stored value (``codec.frame``).

Keys (one column family, four kinds, told apart by their first byte)::

    b"O" | G seq u64 BE                       open G on its coordinator (PREPARED or DISCARDED)
    b"P" | G seq u64 BE                       decided G whose participants are not all told yet
    b"B" | G id (UTF-8) | 0x00 | seq u64 BE   an undecided part (PREPARED or DISCARDED) of G on this shard
    b"M" | G id (UTF-8) | 0x00 | seq u64 BE   a part of G on this shard, decided or not (deleted with
                                              its transaction row by retention: ``txmq txn global``)

Values::

    O: n u16 | participant s16 × n
    P: state u8 | source u8 | n u16 | participant s16 × n      (the participants still to tell;
       state COMMITTED/ROLLED_BACK: G's decision, DISCARDED: G was discarded, discard the parts)
    B, M: empty
"""

from __future__ import annotations

import struct

from .codec import CorruptRecordError, Reader, Writer, frame, unframe

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_HEAD = struct.Struct(">BBH")
OPEN, PUSH, PART, MEMBER = b"O", b"P", b"B", b"M"


def open_key(seq: int) -> bytes:
    return OPEN + _U64.pack(seq)


def push_key(seq: int) -> bytes:
    return PUSH + _U64.pack(seq)


def part_key(gid: str, seq: int) -> bytes:
    return PART + gid.encode() + b"\x00" + _U64.pack(seq)


def member_key(gid: str, seq: int) -> bytes:
    return MEMBER + gid.encode() + b"\x00" + _U64.pack(seq)


def member_prefix(gid: str) -> bytes:
    return MEMBER + gid.encode() + b"\x00"


def split_seq_key(key: bytes) -> int:
    decoded: int = _U64.unpack(key[1:9])[0]
    return decoded


def split_part_key(key: bytes) -> tuple[str, int]:
    return key[1:-9].decode(), _U64.unpack(key[-8:])[0]


def encode_participants(shards: list[str]) -> bytes:
    w = Writer()
    w.raw(_U16.pack(len(shards)))
    for s in shards:
        w.s16(s)
    return frame(w.bytes())


def decode_participants(value: bytes, key: bytes = b"") -> list[str]:
    payload = unframe(value, "global row", key)
    try:
        rd = Reader(payload)
        (n,) = rd.fixed(_U16)
        return [rd.s16() for _ in range(n)]
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("global row", key, str(exc)) from None


def encode_push(state: int, source: int, shards: list[str]) -> bytes:
    w = Writer()
    w.raw(_HEAD.pack(state, source, len(shards)))
    for s in shards:
        w.s16(s)
    return frame(w.bytes())


def decode_push(value: bytes, key: bytes = b"") -> tuple[int, int, list[str]]:
    payload = unframe(value, "global push row", key)
    try:
        rd = Reader(payload)
        state, source, n = rd.fixed(_HEAD)
        return state, source, [rd.s16() for _ in range(n)]
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError("global push row", key, str(exc)) from None
