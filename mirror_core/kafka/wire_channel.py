"""The byte channel under the fast connection: a plain TCP socket, or TLS through ``ssl.SSLObject`` and memory BIOs.

Why memory BIOs: ``ssl.SSLSocket`` has no ``sendmsg``, and the fast path's point is that a Produce request is a list
of buffers (the record batches themselves, never joined). Here the plaintext buffers go to ``SSLObject.write``
as they are (OpenSSL reads them in place; small header pieces are first gathered into one TLS record so a request
is not cut into many tiny records), the ciphertext is drained from the outgoing BIO in ~256 KiB slices and handed
to one ``sendmsg`` per slice; on the way in, one reusable buffer takes ``recv_into`` and feeds the incoming BIO,
and ``SSLObject.read`` decrypts straight into the caller's frame buffer. Encryption is the only copy added.

Receiving by TLS record (the 5-byte header: content type, legacy version, length; then ``length`` bytes): the
incoming BIO is given whole records only, a partial one waits at the front of the receive buffer until the rest has
arrived, so ``SSLObject.read`` is called only when it can return data (no ``SSLWantReadError`` raised and caught per
arrival), one :meth:`TlsChannel.recv_into` decrypts every buffered record into the caller's buffer in one call, and
while a partial record misses at least ``_LOWAT_FROM`` bytes the socket's ``SO_RCVLOWAT`` is that remainder: the
kernel wakes us when the record is complete instead of at every arriving segment of a slow link.

Waking for what the caller still needs (both channels): a caller reading the rest of a large frame (a Fetch answer)
says how many more bytes it will certainly read (``recv_into(view, need)``), and the low-water mark is raised to
that, up to ``_LOWAT_CEILING`` and a quarter of the socket's current receive buffer: over a link the reader wakes
once per ~256 KiB instead of once per arriving burst (the link bench counted ~50 KB per wake at 50 ms, each wake a
``poll``, a ``recv`` and the channel's Python work). The receive-buffer bound matters: Linux grows the buffer for a
mark it cannot hold and clamps the TCP window to the mark from then on (``tcp_set_rcvlowat``); a quarter of the
buffer never triggers that. On TLS the mark counts ciphertext, and a record's plaintext is never longer than its
ciphertext, so ``need`` plaintext bytes, less what is already buffered, are bytes that will certainly arrive.

Also here: :class:`FastSecurity`, what the fast connection needs from a cluster's librdkafka-style settings
(``security.protocol``, ``ssl.ca.location``, client certificate, ``ssl.endpoint.identification.algorithm``,
``sasl.*``), and :class:`HandshakeRefused`, a TLS or SASL refusal that retrying will not cure.

Invariants: a channel is used by one thread; :meth:`send` returns only when every byte is with the kernel;
:meth:`recv_into` returns at least one byte or raises (0 is never returned: a closed peer is an error), and waits
for the network only when nothing is buffered. ``SO_RCVLOWAT`` never exceeds the bytes certain to arrive: what the
current partial TLS record still misses (a peer sends whole records), or the caller's ``need`` less what is
buffered (the peer sends whole frames), whichever is larger; a read without a ``need`` sets it back to 1 first, so a
small answer never waits for bytes that are not coming (a raised mark may outlive the frame it was set for: only
this channel's own blocking reads see it, and each sets its mark first; code that polls the socket for readability
must set the mark back to 1 before it does); a raised mark is at most what a link of ``_LOWAT_SLOWEST_LINK``
bytes/s brings within the socket's timeout, as the timeout then bounds the wait for the whole mark. A TLS peer that
sends close_notify in the middle of a frame and keeps the TCP connection open (no broker does: Kafka closes the
socket right after it) is seen at the socket's timeout, not at once. TLS: the incoming BIO holds whole records
only. TLS hostname verification is on unless the settings say ``ssl.endpoint.identification.algorithm=none``; the
certificate chain is always verified (against ``ssl.ca.location``, or the system store when that is unset).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

_SEND_SLICE = 256 * 1024        # plaintext per SSLObject.write, ciphertext per sendmsg
_GATHER_BELOW = 16 * 1024       # parts smaller than one TLS record are gathered before encryption
_RECV_BUFFER = 256 * 1024       # > the largest record a 16-bit length can announce, so a record always fits
_RECORD_HEADER = 5              # TLS record header: type (1), legacy version (2), length (2, big-endian)
_LOWAT_FROM = 4096              # a partial record missing this much or more: wake when it is complete
# SO_RCVLOWAT's ceiling: a TLS 1.2 record's largest protected size (2**14 + 2048) plus its header. Small on purpose:
# Linux grows the receive buffer for a low-water mark above about half of it and clamps the TCP window to the mark
# then, which a record-sized mark never reaches with the default 128 KiB buffer.
_LOWAT_MAX = 2**14 + 2048 + _RECORD_HEADER
# The caller's need raises the mark up to this (and a quarter of the current receive buffer): a wake per 256 KiB.
_LOWAT_CEILING = 256 * 1024
_ROOM_REREAD = 16               # raised marks asked for between two reads of SO_RCVBUF
_LOWAT_SLOWEST_LINK = 32 * 1024 # bytes/s: a raised mark is at most what arrives within the socket's timeout at this
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") and "SC_IOV_MAX" in os.sysconf_names else 1024


class HandshakeRefused(Exception):
    """The broker's certificate failed verification, or the broker refused the SASL login: not retriable.

    ``stage`` is ``"tls"`` or ``"sasl"``; the message names the broker address and (for SASL) the mechanism and
    user, never a password."""

    def __init__(self, stage: str, address: str, reason: str):
        self.stage = stage
        self.address = address
        self.reason = reason
        super().__init__(f"{address}: {reason}")


@dataclass(frozen=True)
class FastSecurity:
    """How the fast connection secures itself, derived once per cluster from its settings."""

    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> FastSecurity:
        """From validated librdkafka-style settings (:func:`mirror_core.config.cluster.validate_settings`)."""
        protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
        context = tls_context(settings) if protocol in ("SSL", "SASL_SSL") else None
        if not protocol.startswith("SASL_"):
            return cls(protocol, context)
        mechanism = str(settings.get("sasl.mechanism", settings.get("sasl.mechanisms", ""))).upper()
        return cls(protocol, context, mechanism, str(settings["sasl.username"]), str(settings["sasl.password"]))


def tls_context(settings: Mapping[str, str]) -> ssl.SSLContext:
    """A client TLS context: the CA from ``ssl.ca.location`` (else the system store), an optional client
    certificate, hostname verification unless ``ssl.endpoint.identification.algorithm`` is ``none``."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.get("ssl.ca.location") or None)
    if settings.get("ssl.certificate.location"):
        context.load_cert_chain(settings["ssl.certificate.location"], settings.get("ssl.key.location") or None,
                                settings.get("ssl.key.password") or None)
    if str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        context.check_hostname = False
    return context


class LowWaterMark:
    """The socket's ``SO_RCVLOWAT`` as last set. A mark is kept under a quarter of the receive buffer
    (``SO_RCVBUF``): above about half, Linux grows the buffer and clamps the TCP window to the mark for the rest of
    the connection (``tcp_set_rcvlowat``), which would cap a long link at mark / RTT. The buffer's size is read
    again every ``_ROOM_REREAD`` raised marks asked for (autotuning grows it, memory pressure can shrink it), not
    before every read."""

    __slots__ = ("sock", "value", "_room", "_until_reread")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.value = 1          # the kernel's default
        self._room = 0          # a quarter of SO_RCVBUF when last read
        self._until_reread = 0  # marks set before SO_RCVBUF is read again anyway

    def want(self, certain: int, limit: int = _LOWAT_CEILING) -> None:
        """Wake the reader once ``certain`` bytes (bytes that will arrive) are in, capped by ``limit``,
        ``_LOWAT_CEILING`` and the receive buffer; below ``_LOWAT_FROM`` the mark is 1 (a syscall saved is worth
        more than a wake saved)."""
        value = min(certain, limit, _LOWAT_CEILING)
        timeout = self.sock.gettimeout()
        if timeout is not None and value > timeout * _LOWAT_SLOWEST_LINK:
            # the socket's timeout now bounds the wait for the whole mark, not for the next byte: keep a frame on a
            # slow link (below _LOWAT_SLOWEST_LINK bytes/s) from timing out where byte-by-byte it would have finished
            value = int(timeout * _LOWAT_SLOWEST_LINK)
        if value >= _LOWAT_FROM:
            if self._until_reread <= 0:
                self._room = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
                self._until_reread = _ROOM_REREAD
            self._until_reread -= 1
            value = min(value, self._room)
        if value < _LOWAT_FROM:
            value = 1
        if value != self.value:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, value)
            self.value = value


class PlainChannel:
    """A connected TCP socket: ``sendmsg`` of the caller's buffers, ``recv_into`` the caller's buffer."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lowat = LowWaterMark(sock)

    def send(self, parts) -> None:
        _sendmsg_all(self.sock, [part for part in parts if len(part)])

    def recv_into(self, view: memoryview, need: int = 1) -> int:
        """Up to ``len(view)`` bytes, at least one; ``need``: bytes the caller will certainly read next (the rest
        of its frame), so the kernel need not wake it before that many (or the mark's ceiling) are in."""
        if need > 1 or self._lowat.value != 1:
            self._lowat.want(need, len(view))
        n = self.sock.recv_into(view)
        if n == 0:
            raise ConnectionResetError("connection closed by the broker")
        return n

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class TlsChannel:
    """TLS over a connected TCP socket through ``ssl.SSLObject`` and two memory BIOs (see the module docstring).

    :meth:`handshake` must succeed before :meth:`send` / :meth:`recv_into`; a certificate that fails verification
    raises :class:`HandshakeRefused` naming ``server_hostname``."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: str):
        self.sock = sock
        self.server_hostname = server_hostname
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=False,
                                     server_hostname=server_hostname)
        self._buffer = bytearray(_RECV_BUFFER)  # received ciphertext not in the BIO: _buffer[:_tail], a partial record
        self._view = memoryview(self._buffer)
        self._tail = 0
        self._lowat = LowWaterMark(sock)
        self._peer_closed = False               # close_notify read (the data before it already returned)
        # SSLObject.read is a Python wrapper around the C object's read, called once per TLS record (~100,000 per
        # GB): call the C method directly where this Python has it
        self._read = getattr(self._ssl, "_sslobj", self._ssl).read

    @property
    def version(self) -> str | None:
        return self._ssl.version()

    def handshake(self, address: str) -> None:
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
            except ssl.SSLCertVerificationError as exc:
                raise HandshakeRefused("tls", address, _verify_reason(exc, self.server_hostname)) from None
        self._flush()

    def send(self, parts) -> None:
        """Encrypt ``parts`` in order and hand the ciphertext to the kernel: parts smaller than ``_GATHER_BELOW``
        are gathered into one TLS record (a request's header pieces), a larger part goes to ``SSLObject.write`` as
        it is (sliced only above ``_SEND_SLICE``); whenever the outgoing BIO holds ``_SEND_SLICE`` it is drained,
        and the drained pieces leave in one ``sendmsg`` per ``_SEND_SLICE`` or more. Python work is per part (a
        record batch), never per TLS record: OpenSSL cuts the records."""
        out, write = self._outgoing, self._ssl.write
        gathered = bytearray()
        pending: list[bytes] = []
        pending_bytes = 0
        for part in parts:
            size = part.nbytes if isinstance(part, memoryview) else len(part)
            if size < _GATHER_BELOW:
                if not size:
                    continue
                gathered += part
                if len(gathered) < _GATHER_BELOW:
                    continue
                chunks, gathered = (gathered,), bytearray()
            else:
                if gathered:
                    _write_all(write, gathered)
                    gathered = bytearray()
                if size <= _SEND_SLICE:
                    chunks = (part,)
                else:
                    view = memoryview(part).cast("B")
                    chunks = [view[i:i + _SEND_SLICE] for i in range(0, size, _SEND_SLICE)]
            for chunk in chunks:
                _write_all(write, chunk)
                if out.pending >= _SEND_SLICE:
                    pending.append(out.read())
                    pending_bytes += len(pending[-1])
                    if pending_bytes >= _SEND_SLICE:
                        _sendmsg_all(self.sock, pending)
                        pending, pending_bytes = [], 0
        if gathered:
            _write_all(write, gathered)
        if out.pending:
            pending.append(out.read())
        if pending:
            _sendmsg_all(self.sock, pending)

    def recv_into(self, view: memoryview, need: int = 1) -> int:
        """Decrypt into ``view`` every record already received (up to its size); wait for the network only when no
        plaintext and no whole record is buffered. ``need``: plaintext bytes the caller will certainly read next
        (the rest of its frame), which lets the wait last until that much ciphertext is in (module docstring)."""
        total, got = len(view), 0
        incoming, read = self._incoming, self._read
        if self._peer_closed:
            raise ConnectionResetError("TLS session closed by the broker")
        if not incoming.pending and not self._ssl.pending():
            self._fill(need)
        while True:
            try:
                n = read(total - got, view[got:] if got else view)
            except ssl.SSLWantReadError:        # the whole records were not application data (a session ticket)
                if got:
                    break
                if self._outgoing.pending:      # a post-handshake message to answer before we wait for more
                    self._flush()
                self._fill(need)                # got is 0 here, so the caller's need is still whole
                continue
            except ssl.SSLZeroReturnError:
                n = 0
            if n == 0:                          # close_notify: no more data on this session
                self._peer_closed = True
                if got:
                    break
                raise ConnectionResetError("TLS session closed by the broker")
            got += n
            if got == total or not incoming.pending:
                break
        if self._outgoing.pending:      # post-handshake messages (TLS 1.3 key update) to answer
            self._flush()
        return got

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _flush(self) -> None:
        if self._outgoing.pending:
            self.sock.sendall(self._outgoing.read())

    def _fill(self, need: int = 1) -> None:
        """Receive until at least one more whole record is buffered; hand the whole records to the incoming BIO and
        keep the partial one at the front of ``_buffer``. ``need``: plaintext the caller will certainly read, of
        which every byte not yet buffered as ciphertext is still to arrive."""
        view, end = self._view, self._tail
        while True:
            whole, missing = whole_records(view, end)
            if whole:
                break
            certain = need - end - self._incoming.pending
            if certain > missing:   # the caller's frame: wait for as much of it as the buffer takes
                self._lowat.want(certain, _RECV_BUFFER - end)
            else:                   # the partial record: wait for its end
                self._lowat.want(missing, _LOWAT_MAX)
            n = self.sock.recv_into(view[end:])
            if n == 0:
                raise ConnectionResetError("connection closed by the broker during TLS")
            end += n
        self._incoming.write(view[:whole])
        rest = end - whole
        if rest:
            view[:rest] = view[whole:end]
        self._tail = rest


def whole_records(buf, end: int) -> tuple[int, int]:
    """(bytes of ``buf[:end]`` that are whole TLS records, counted from the start; bytes the record after them
    still misses — at least 1). Only the headers are read; OpenSSL judges the rest: a header announcing more than any
    TLS record can hold counts everything buffered as whole, so OpenSSL reads that header at once and raises its
    record-overflow error (instead of waiting for bytes a garbled stream will never send)."""
    pos = 0
    while True:
        if end - pos < _RECORD_HEADER:
            return pos, _RECORD_HEADER - (end - pos)
        length = buf[pos + 3] << 8 | buf[pos + 4]
        if length > _LOWAT_MAX - _RECORD_HEADER:   # no TLS record is this long: let OpenSSL refuse it now
            return end, 1
        after = pos + _RECORD_HEADER + length
        if after > end:
            return pos, after - end
        pos = after


def _write_all(write, data) -> None:
    """``SSLObject.write`` of every byte of ``data`` (a bytes-like object): over a memory BIO OpenSSL takes it all in
    one call (the BIO grows, partial writes are not enabled), so the loop after the first call is only a guard."""
    written, size = write(data), data.nbytes if isinstance(data, memoryview) else len(data)
    if written < size:
        view = memoryview(data).cast("B")
        while written < size:
            written += write(view[written:])


def _sendmsg_all(sock: socket.socket, pending: list) -> None:
    """Write every buffer (partial sends resume mid-buffer, nothing is joined), at most ``_IOV_MAX`` buffers per
    call: Linux refuses more (``writev``: EINVAL, ``sendmsg``: EMSGSIZE), and a Produce request shared by many lanes
    has two buffers per partition.

    ``os.writev`` on the descriptor first: CPython's ``sendmsg`` on a socket with a timeout calls ``poll`` before
    every send, even when the send buffer has room (one extra system call per request; with one-record batches,
    one per batch). The descriptor of a socket with a timeout is non-blocking, so ``writev`` never waits: only when
    the send buffer is full (``EAGAIN``) does ``sendmsg`` wait for room under the socket's timeout."""
    i, count = 0, len(pending)
    while i < count:
        chunk = pending[i:i + _IOV_MAX]
        fd = sock.fileno()   # asked each pass, as sendmsg does: a number kept across a wait could be reused
        try:
            sent = os.writev(fd, chunk) if fd >= 0 else sock.sendmsg(chunk)   # -1: closed, sendmsg says so
        except BlockingIOError:
            sent = sock.sendmsg(chunk)
        while i < count:   # consume what was written; empty buffers count as written
            part = pending[i]
            size = part.nbytes if isinstance(part, memoryview) else len(part)
            if sent < size:
                if sent:
                    pending[i] = memoryview(part).cast("B")[sent:]
                break
            sent -= size
            i += 1


def _verify_reason(exc: ssl.SSLCertVerificationError, hostname: str) -> str:
    detail = exc.verify_message or exc.reason or str(exc)
    if "mismatch" in str(detail).lower() or "hostname" in str(detail).lower():
        return (f"TLS hostname verification failed: the broker's certificate is not valid for {hostname!r} "
                f"({detail}); connect by a name the certificate carries, or fix the certificate")
    return (f"TLS certificate verification failed for {hostname!r} ({detail}); check ssl.ca.location "
            "(the CA that signed the broker's certificate)")
