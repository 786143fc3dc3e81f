"""The receive side of a :class:`~mirror_core.kafka.fast_connection.FastConnection`: response frames read through a
64 KiB buffer of its own.

Why (``docs/performance.md``): kafka-python receives a 4 MiB Fetch response in 4 KiB ``recv`` calls and copies it
three times (joined chunks, frame buffer, ``bytes`` of the records field). Here a frame is received with
``recv_into``: small answers through the connection's receive buffer (so size field and body, and often the next
pipelined answers, come in one call), a large one straight into a ``bytearray`` of its own, whose records field the
Fetch decoder hands out as a ``memoryview``.

Invariants: the unread bytes are ``_rbuf[_rstart:_rend]``; a frame is returned whole, as a new ``bytearray`` the
caller owns; nothing reads more than the socket has ready, so nothing waits for bytes no request asked for; a frame
size outside 4..100 MB is a protocol error.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios

import kafka.errors as Errors

from mirror_core.codec.kafka_primitives import I32

_I32N = struct.Struct("=i")  # native order (ioctl results)
_MAX_FRAME = 100_000_000
RECV_BUFFER = 64 * 1024           # FastConnection's receive buffer: answers up to this size are read through it


class ResponseFrames:
    """The frame reading of :class:`~mirror_core.kafka.fast_connection.FastConnection` (a mixin: it reads through the
    connection's ``_channel`` and ``_sock`` into ``_rbuf`` / ``_rview`` and counts ``bytes_received``)."""

    def _init_receive_buffer(self) -> None:
        self._rbuf = bytearray(RECV_BUFFER)       # received, not yet framed bytes: _rbuf[_rstart:_rend]
        self._rview = memoryview(self._rbuf)
        self._rstart = self._rend = 0
        self.bytes_received = 0                  # response frames read, size fields included

    def _frame_buffered(self) -> bool:
        have = self._rend - self._rstart
        return have >= 4 and have >= 4 + I32.unpack_from(self._rbuf, self._rstart)[0]

    def _read_ready(self) -> None:
        """Move what the kernel holds for us into ``_rbuf`` without waiting. The socket has a timeout, so its
        descriptor is non-blocking (CPython's timeout mode) and ``readv`` returns at once; a closed or failed socket
        is left for the next blocking read to report."""
        if self._rstart and self._rend - self._rstart < 4096:   # room at the end: move the unread bytes forward
            have = self._rend - self._rstart
            self._rview[:have] = self._rview[self._rstart:self._rend]
            self._rstart, self._rend = 0, have
        if self._rend >= RECV_BUFFER:
            return
        try:  # noqa: SIM105 - contextlib.suppress costs three calls on every read of a one-record-batch copy
            self._rend += os.readv(self._sock.fileno(), [self._rview[self._rend:]])
        except OSError:   # BlockingIOError: nothing yet
            pass

    def _answer_ready(self) -> bool:
        """(Tracing only) whether bytes of the next answer are buffered or in the socket already."""
        if self._rend > self._rstart:
            return True
        try:  # the socket has a timeout, so recv(MSG_PEEK) would wait for the bytes: ask the kernel instead
            return _I32N.unpack(fcntl.ioctl(self._sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] > 0
        except OSError:
            return True

    def _receive_frame(self) -> bytearray:
        """The next response frame (without its size field) as a new ``bytearray`` the caller owns.

        Reads go through ``_rbuf`` (``RECV_BUFFER`` bytes): one ``recv_into`` usually brings a small answer's size
        field and body together, and often the next answers of the pipeline too, which stay in ``_rbuf`` between
        ``_rstart`` and ``_rend`` for the next call. A frame that fits in ``_rbuf`` is copied out of it; a larger one
        (a Fetch answer) gets its own ``bytearray``: what ``_rbuf`` holds of it is copied in, the rest is received
        straight into it. Never reads more than the socket has ready, so nothing waits for bytes no request asked
        for."""
        start = self._rstart
        have = self._rend - start
        if have >= 4:   # the usual small answer, already whole in _rbuf (pipelined answers often are)
            (size,) = I32.unpack_from(self._rbuf, start)
            if 4 <= size <= have - 4:
                start += 4
                end = start + size
                frame = self._rbuf[start:end]
                if end == self._rend:
                    self._rstart = self._rend = 0
                else:
                    self._rstart = end
                self.bytes_received += 4 + size
                return frame
        self._buffered(4)
        (size,) = I32.unpack_from(self._rbuf, self._rstart)
        if not 4 <= size <= _MAX_FRAME:
            raise Errors.KafkaProtocolError(f"invalid frame length {size}")
        self._rstart += 4
        if size <= RECV_BUFFER:
            self._buffered(size)
            start = self._rstart
            frame = self._rbuf[start:start + size]
            self._rstart = start + size
        else:
            frame = bytearray(size)
            have = self._rend - self._rstart
            frame[:have] = self._rview[self._rstart:self._rend]
            self._rstart = self._rend = 0
            self._recv_exact(memoryview(frame)[have:])
        if self._rstart == self._rend:
            self._rstart = self._rend = 0
        self.bytes_received += 4 + size
        return frame

    def _buffered(self, need: int) -> None:
        """Receive until ``_rbuf`` holds at least ``need`` (<= ``RECV_BUFFER``) unread bytes from ``_rstart``."""
        if self._rend - self._rstart >= need:
            return
        if self._rstart + need > RECV_BUFFER:            # move the unread bytes to the front to make room
            have = self._rend - self._rstart
            self._rview[:have] = self._rview[self._rstart:self._rend]
            self._rstart, self._rend = 0, have
        recv_into, view = self._channel.recv_into, self._rview
        try:
            while self._rend - self._rstart < need:
                self._rend += recv_into(view[self._rend:])
        except ConnectionResetError as exc:
            raise Errors.KafkaConnectionError(f"{self!r}: {exc}") from None

    def _recv_exact(self, view: memoryview) -> None:
        """Fill ``view`` (the rest of a large frame): every byte is certain to come, so the channel is told how many
        are still needed and may sleep until a good part of them is in instead of waking for each arrival."""
        recv_into, got, total = self._channel.recv_into, 0, len(view)
        try:
            while got < total:
                got += recv_into(view[got:], total - got)
        except ConnectionResetError as exc:
            raise Errors.KafkaConnectionError(f"{self!r}: {exc}") from None
