"""Kafka's wire primitives, pure bytes: the request header, varints, strings and arrays, a reader over a response
frame, and ApiVersions v0 (the first request of every connection).

The message modules build on these (:mod:`mirror_core.codec.produce_messages`,
:mod:`mirror_core.codec.fetch_messages`, :mod:`mirror_core.codec.sasl_messages`); the connection that sends them is
:class:`mirror_core.kafka.fast_connection.FastConnection`. Everything is tested byte-identical against
kafka-python's own encoder and decoder (``tests/unit/kafka/test_wire_fastpath.py``): request header v1/v2 (a frame's
size field first), ApiVersions v0.

Invariants: a request is framed (its size field counts what follows it); the header's client id is never a compact
string, whatever the request's version; :class:`Reader` never reads past its frame without raising ``ValueError``
(or ``IndexError`` / ``struct.error`` from the buffer), which the connection reports as an undecodable answer.
"""

from __future__ import annotations

import struct
import uuid

import kafka.errors as Errors

API_VERSIONS = 18

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
HEADER = struct.Struct(">ihhi")            # frame size, api key, api version, correlation id
_API_RANGE = struct.Struct(">hhh")


def uvarint(value: int) -> bytes:
    """Unsigned varint (Kafka's compact lengths and tag counts)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_string(value: str | None, compact: bool) -> bytes:
    """A (nullable) string: INT16 length, or a compact string's unsigned varint of length + 1."""
    if value is None:
        return b"\x00" if compact else b"\xff\xff"
    raw = value.encode("utf-8")
    return (uvarint(len(raw) + 1) if compact else I16.pack(len(raw))) + raw


def array_len(count: int, compact: bool) -> bytes:
    """An array's length field: INT32, or a compact array's unsigned varint of count + 1."""
    return uvarint(count + 1) if compact else I32.pack(count)


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None, flexible: bool,
                   body_size: int) -> bytes:
    """Frame size + request header (v1, or v2 with an empty tag buffer); ``body_size`` counts what follows."""
    client = encode_string(client_id, compact=False)     # the header's client id is never compact
    tags = b"\x00" if flexible else b""
    size = 8 + len(client) + len(tags) + body_size
    return HEADER.pack(size, api_key, version, correlation_id) + client + tags


class Reader:
    """Sequential reads from a response frame (a memoryview); ``pos`` is the next byte."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def i8(self) -> int:
        value = I8.unpack_from(self.buf, self.pos)[0]
        self.pos += 1
        return value

    def i16(self) -> int:
        value = I16.unpack_from(self.buf, self.pos)[0]
        self.pos += 2
        return value

    def i32(self) -> int:
        value = I32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return value

    def i64(self) -> int:
        value = I64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return value

    def uvarint(self) -> int:
        buf, pos = self.buf, self.pos
        value = shift = 0
        while True:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.pos = pos
                return value
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def length(self, compact: bool, wide: bool = False) -> int:
        """A string/bytes/array length; -1 means null."""
        if compact:
            return self.uvarint() - 1
        return self.i32() if wide else self.i16()

    def string(self, compact: bool) -> str | None:
        n = self.length(compact)
        if n < 0:
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError("string runs past the frame")
        value = str(self.buf[self.pos:end], "utf-8")
        self.pos = end
        return value

    def array(self, compact: bool) -> int:
        return self.uvarint() - 1 if compact else self.i32()

    def bytes_view(self, compact: bool) -> memoryview | None:
        n = self.uvarint() - 1 if compact else self.i32()
        if n < 0:
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError("bytes run past the frame")
        view = self.buf[self.pos:end]
        self.pos = end
        return view

    def uuid(self) -> uuid.UUID:
        value = uuid.UUID(bytes=bytes(self.buf[self.pos:self.pos + 16]))
        self.pos += 16
        return value

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()                       # tag
            size = self.uvarint()                # (not `pos += uvarint()`: that adds to the pos before it)
            self.pos += size
        if self.pos > len(self.buf):
            raise ValueError("tagged fields run past the frame")



def decode_api_versions(frame: memoryview) -> dict[int, tuple[int, int]]:
    """An ApiVersionsResponse v0 (after its header): api key -> (lowest, highest) version the broker speaks;
    a top-level error raises kafka-python's error for its code."""
    r = Reader(frame)
    error = r.i16()
    count = r.i32()
    versions = {}
    for _ in range(max(count, 0)):
        key, low, high = _API_RANGE.unpack_from(r.buf, r.pos)
        r.pos += 6
        versions[key] = (low, high)
    if error:
        raise Errors.for_code(error)()
    return versions
