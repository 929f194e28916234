"""Plasma's notification messages: flatbuffers ``PlasmaNotification`` tables, framed by an
8-byte length, as pyarrow.plasma 11's store wrote them to a subscriber's socket.

The schema (Arrow 11, ``cpp/src/plasma/plasma.fbs`` and ``common.fbs``)::

    table ObjectInfo {
      object_id: string;          // field 0
      data_size: long;            // 1
      metadata_size: long;        // 2
      ref_count: int;             // 3
      create_time: long;          // 4
      construct_duration: long;   // 5
      digest: string;             // 6
      is_deletion: bool;          // 7
    }
    table PlasmaNotification { object_info: [ObjectInfo]; }

Written by hand (a fixed layout, every field present) to need no flatbuffers package; read
by a general table reader, so messages of Plasma's own store decode too.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import List

#: The frame's length prefix: an unsigned 64-bit integer in the machine's byte order, as
#: Plasma wrote it (``struct.unpack("L", sock.recv(8))`` on Linux x86-64 and arm64).
LENGTH = struct.Struct("=Q")


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a notification."""

    object_id: bytes
    data_size: int = 0
    metadata_size: int = 0
    ref_count: int = 0
    create_time: int = 0
    construct_duration: int = 0
    digest: bytes = b""
    is_deletion: bool = False


# ObjectInfo's table, fields in the order of their offsets below (8-byte fields aligned).
_INFO_FIELDS = 8
# soffset, object_id, data_size, metadata_size, ref_count, digest, create_time,
# construct_duration, is_deletion: the table starts 8-aligned, so its longs are too.
_INFO_BODY = struct.Struct("<iIqqiIqq?3x")
_INFO_SLOTS = (4, 8, 16, 24, 32, 40, 28, 48)  # where fields 0..7 lie in the table


def _string(payload: bytes) -> bytes:
    """A flatbuffers string: length, bytes, NUL, padded to 4."""
    body = struct.pack("<I", len(payload)) + payload + b"\0"
    return body + b"\0" * (-len(body) % 4)


def _pad(buffer: bytearray, alignment: int) -> None:
    buffer.extend(b"\0" * (-len(buffer) % alignment))


def encode(infos: List[ObjectInfo]) -> bytes:
    """A ``PlasmaNotification`` holding ``infos``."""
    out = bytearray()
    out += struct.pack("<I", 0)  # root offset, patched below
    # The root table's vtable, then the table: its one field is the vector's offset.
    root_vtable = len(out)
    out += struct.pack("<HHH", 6, 8, 4)
    _pad(out, 4)
    root = len(out)
    out += struct.pack("<iI", root - root_vtable, 0)
    struct.pack_into("<I", out, 0, root)
    # The vector of table offsets.
    _pad(out, 4)
    vector = len(out)
    struct.pack_into("<I", out, root + 4, vector - (root + 4))
    out += struct.pack("<I", len(infos)) + b"\0" * (4 * len(infos))
    # One vtable shared by every ObjectInfo.
    info_vtable = len(out)
    out += struct.pack("<HH", 4 + 2 * _INFO_FIELDS, _INFO_BODY.size)
    out += struct.pack(f"<{_INFO_FIELDS}H", *_INFO_SLOTS)
    for index, info in enumerate(infos):
        _pad(out, 8)
        table = len(out)
        slot = vector + 4 + 4 * index
        struct.pack_into("<I", out, slot, table - slot)
        out += b"\0" * _INFO_BODY.size
        object_id_at = len(out)
        out += _string(info.object_id)
        digest_at = len(out)
        out += _string(info.digest)
        _INFO_BODY.pack_into(
            out,
            table,
            table - info_vtable,
            object_id_at - (table + 4),
            info.data_size,
            info.metadata_size,
            info.ref_count,
            digest_at - (table + 28),
            info.create_time,
            info.construct_duration,
            info.is_deletion,
        )
    _pad(out, 8)
    return bytes(out)


def frame(message: bytes) -> bytes:
    """The message with its length prefix, as it travels on the socket."""
    return LENGTH.pack(len(message)) + message


class _Table:
    """A flatbuffers table at ``position`` in ``buffer``: fields by index, with defaults."""

    def __init__(self, buffer: bytes, position: int) -> None:
        self.buffer = buffer
        self.position = position
        (soffset,) = struct.unpack_from("<i", buffer, position)
        self.vtable = position - soffset
        self.vtable_size, _ = struct.unpack_from("<HH", buffer, self.vtable)

    def _field(self, index: int) -> int:
        entry = 4 + 2 * index
        if entry >= self.vtable_size:
            return 0
        (offset,) = struct.unpack_from("<H", self.buffer, self.vtable + entry)
        return self.position + offset if offset else 0

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self._field(index)
        return struct.unpack_from("<" + fmt, self.buffer, at)[0] if at else default

    def _indirect(self, at: int) -> int:
        return at + struct.unpack_from("<I", self.buffer, at)[0]

    def string(self, index: int) -> bytes:
        at = self._field(index)
        if not at:
            return b""
        start = self._indirect(at)
        (length,) = struct.unpack_from("<I", self.buffer, start)
        return bytes(self.buffer[start + 4 : start + 4 + length])

    def tables(self, index: int) -> List["_Table"]:
        at = self._field(index)
        if not at:
            return []
        start = self._indirect(at)
        (count,) = struct.unpack_from("<I", self.buffer, start)
        return [
            _Table(self.buffer, self._indirect(start + 4 + 4 * i)) for i in range(count)
        ]


def decode(message: bytes) -> List[ObjectInfo]:
    """The objects of one ``PlasmaNotification`` (without its length prefix)."""
    try:
        (root,) = struct.unpack_from("<I", message, 0)
        return [
            ObjectInfo(
                object_id=table.string(0),
                data_size=table.scalar(1, "q"),
                metadata_size=table.scalar(2, "q"),
                ref_count=table.scalar(3, "i"),
                create_time=table.scalar(4, "q"),
                construct_duration=table.scalar(5, "q"),
                digest=table.string(6),
                is_deletion=bool(table.scalar(7, "B")),
            )
            for table in _Table(message, root).tables(0)
        ]
    except struct.error as error:
        raise ValueError(f"not a PlasmaNotification message: {error}") from error


def read_message(sock: socket.socket) -> bytes:
    """Reads one framed message from ``sock`` (blocking)."""
    (length,) = LENGTH.unpack(_read_exactly(sock, LENGTH.size))
    return _read_exactly(sock, length)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = sock.recv(size)
        if not chunk:
            raise ConnectionError("the notification socket was closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
