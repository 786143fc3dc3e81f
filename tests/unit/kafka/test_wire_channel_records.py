"""The TLS channel's receive side record by record (mirror_core.kafka.wire_channel): a scripted peer — a real TLS 1.3
server (``ssl.SSLObject`` on memory BIOs) whose ciphertext reaches the channel in exactly the pieces a test chooses —
checks that the plaintext arrives whole and in order whatever the split (every byte alone, several records in one
piece, a frame straddling records), that a read never waits for bytes the peer did not send while plaintext or a
whole record is buffered, that the low-water mark never asks for more than the current record still misses, and
that close_notify and a peer closing mid-record are clean errors."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl

import pytest

from mirror_core.dev.sandbox.tls import pem_server_material
from mirror_core.kafka.wire_channel import _GATHER_BELOW, _SEND_SLICE, TlsChannel, tls_context, whole_records

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    home = tmp_path_factory.mktemp("tls")
    return pem_server_material(home)


class ScriptedPeer:
    """Stands in for the channel's socket. What the channel sends goes into a TLS server; what the server emits is
    queued and handed to ``recv_into`` in the pieces :meth:`split` makes (joined up to ``SO_RCVLOWAT``, as the
    kernel would). ``recv_into`` with nothing queued fails the test (a real socket would block: the channel waited
    for bytes nobody sent), as does a low-water mark above the bytes still to come."""

    def __init__(self, material, split):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(material["cert"], material["key"])
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.server = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.split = split
        self.pieces: list[bytes] = []
        self.lowat = 1
        self.lowats: list[int] = []
        self.recv_calls = 0
        self.closed_after = False          # True: an empty read (peer closed) once the pieces are gone
        self.rcvbuf = 4 << 20              # what SO_RCVBUF answers (an autotuned buffer on a busy link)
        self.rcvbuf_reads = 0

    # -- the socket the channel sees ----------------------------------------------------------------------------
    def sendall(self, data) -> None:
        self.incoming.write(bytes(data))
        with contextlib.suppress(ssl.SSLWantReadError):
            self.server.do_handshake()
        self._emit()

    def sendmsg(self, buffers) -> int:
        data = b"".join(bytes(b) for b in buffers)
        self.sendall(data)
        return len(data)

    def recv_into(self, view) -> int:
        self.recv_calls += 1
        if not self.pieces:
            if self.closed_after:
                return 0
            raise AssertionError("the channel waited for bytes the peer never sent")
        assert self.lowat <= sum(map(len, self.pieces)), "SO_RCVLOWAT above what the peer will send"
        piece = self.pieces.pop(0)
        while len(piece) < self.lowat:              # the kernel wakes the reader only at the low-water mark
            piece += self.pieces.pop(0)
        if len(piece) > len(view):                  # the kernel hands over what fits; the rest stays queued
            self.pieces.insert(0, piece[len(view):])
            piece = piece[:len(view)]
        view[:len(piece)] = piece
        return len(piece)

    def setsockopt(self, level, option, value) -> None:
        assert (level, option) == (socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        assert value <= self.rcvbuf // 4, "a mark this high makes Linux clamp the TCP window"
        self.lowat = value
        self.lowats.append(value)

    def fileno(self) -> int:
        return -1                          # no descriptor: the channel writes through sendmsg

    def gettimeout(self) -> float:
        return 30.0

    def getsockopt(self, level, option) -> int:
        assert (level, option) == (socket.SOL_SOCKET, socket.SO_RCVBUF)
        self.rcvbuf_reads += 1
        return self.rcvbuf

    def close(self) -> None:
        pass

    # -- the script ---------------------------------------------------------------------------------------------
    def send_records(self, *plaintexts: bytes) -> None:
        """One TLS record per plaintext (each ≤ 16 KiB), queued in the pieces ``split`` cuts."""
        for plaintext in plaintexts:
            self.server.write(plaintext)
        self._emit()

    def close_notify(self) -> None:
        with contextlib.suppress(ssl.SSLWantReadError):
            self.server.unwrap()
        self._emit()

    def _emit(self) -> None:
        data = self.outgoing.read()
        if data:
            self.pieces.extend(self.split(data))


def every_byte(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


def whole(data: bytes) -> list[bytes]:
    return [data]


def segments(size: int):
    return lambda data: [data[i:i + size] for i in range(0, len(data), size)]


def connected(material, split) -> tuple[TlsChannel, ScriptedPeer]:
    peer = ScriptedPeer(material, split)
    channel = TlsChannel(peer, tls_context({"ssl.ca.location": material["ca"]}), "localhost")
    channel.handshake("localhost:0")       # the server's session tickets (TLS 1.3) stay queued for the first read
    return channel, peer


def read_exactly(channel: TlsChannel, size: int, chunk: int | None = None) -> bytes:
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        end = size if chunk is None else min(size, got + chunk)
        got += channel.recv_into(view[got:end])
    return bytes(out)


def test_whole_records_counts_only_complete_records_and_what_the_next_one_misses():
    records = b"".join(bytes([23, 3, 3]) + len(body).to_bytes(2, "big") + body for body in (b"a" * 10, b"b" * 300))
    first, total = 15, len(records)
    assert whole_records(records, total) == (total, 5)
    assert whole_records(records, total - 1) == (first, 1)
    assert whole_records(records, first + 3) == (first, 2)          # inside the second header
    assert whole_records(records, first + 5) == (first, 300)        # header complete, body missing
    assert whole_records(records, 0) == (0, 5)
    for end in range(total + 1):                                    # every cut point: never past the cut
        done, missing = whole_records(records, end)
        assert done in (0, first, total) and done <= end and missing >= 1


@pytest.mark.parametrize("split", [every_byte, whole, segments(1448), segments(7)],
                         ids=["every-byte", "one-piece", "mss-1448", "7-byte-pieces"])
def test_records_arrive_whole_and_in_order_however_the_ciphertext_is_cut(material, split):
    channel, peer = connected(material, split)
    bodies = [os.urandom(n) for n in (1, 100, 5000, 16384, 3)]
    peer.send_records(*bodies)
    assert read_exactly(channel, sum(map(len, bodies))) == b"".join(bodies)
    assert not peer.pieces


def test_several_records_in_one_piece_come_back_in_one_read_and_then_nothing_is_waited_for(material):
    channel, peer = connected(material, whole)
    bodies = [os.urandom(n) for n in (1000, 2000, 3000)]
    peer.send_records(*bodies)
    peer.pieces = [b"".join(peer.pieces)]    # the session tickets after the handshake and the three, one piece
    buffer = bytearray(100_000)
    calls_before = peer.recv_calls
    n = channel.recv_into(memoryview(buffer))
    assert n == 6000 and bytes(buffer[:n]) == b"".join(bodies)
    assert peer.recv_calls == calls_before + 1          # one kernel read for the tickets and the three records
    with pytest.raises(AssertionError, match="never sent"):
        channel.recv_into(memoryview(buffer))           # nothing buffered: now (and only now) it waits


def test_a_frame_straddling_records_is_read_in_caller_sized_pieces(material):
    """A Kafka frame (4-byte size, then the body) cut across records, read the way FastConnection reads: small
    views first (the size field), then the rest; plaintext left in a record is served before any new receive."""
    channel, peer = connected(material, segments(1448))
    frame = (30_000).to_bytes(4, "big") + os.urandom(30_000)
    second = (10).to_bytes(4, "big") + b"0123456789"
    stream = frame + second
    peer.send_records(stream[:3], stream[3:9000], stream[9000:25_000], stream[25_000:])
    assert read_exactly(channel, 4) == frame[:4]
    assert read_exactly(channel, 30_000, chunk=4096) == frame[4:]
    assert read_exactly(channel, 4) == second[:4]
    assert read_exactly(channel, 10) == second[4:]
    assert not peer.pieces


def test_the_low_water_mark_asks_only_for_what_the_partial_record_misses(material):
    channel, peer = connected(material, segments(1000))
    body = os.urandom(16_000)
    peer.send_records(body)
    assert read_exactly(channel, len(body)) == body         # ScriptedPeer checks each mark against what is left
    assert any(mark >= 4096 for mark in peer.lowats), peer.lowats
    peer.send_records(b"x" * 10)                             # a small record: the mark goes back down to 1
    assert read_exactly(channel, 10) == b"x" * 10
    assert peer.lowat == 1


def read_frame_rest(channel: TlsChannel, size: int) -> bytes:
    """The way FastConnection._recv_exact reads the rest of a large frame: telling the channel what it still needs."""
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        got += channel.recv_into(view[got:], size - got)
    return bytes(out)


def test_a_large_frame_read_with_its_need_wakes_per_many_records_and_never_waits_past_the_frame(material):
    """A 1 MB frame in 16 KiB records arriving in 1448-byte segments: told the need, the channel sets a mark of
    many records (the peer checks every mark against what is still to come: the frame, not a byte more), reads far
    less often than once per record, and a small answer after it is read at a mark of 1 again (no wait for bytes
    that are not coming)."""
    channel, peer = connected(material, segments(1448))
    body = os.urandom(1_000_000)
    peer.send_records(*(body[i:i + 16384] for i in range(0, len(body), 16384)))
    calls_before = peer.recv_calls
    assert read_frame_rest(channel, len(body)) == body
    records = -(-len(body) // 16384)
    assert max(peer.lowats) >= 128 * 1024, peer.lowats
    assert peer.recv_calls - calls_before < records / 4, (peer.recv_calls - calls_before, records)
    peer.send_records(b"small answer")
    assert read_exactly(channel, 12) == b"small answer"
    assert peer.lowat == 1 and not peer.pieces


def test_a_small_fixed_receive_buffer_bounds_the_mark_and_is_not_asked_for_every_read(material):
    """SO_RCVBUF at 64 KiB (an operator's socket.receive.buffer.bytes, or memory pressure shrinking it after the
    handshake): a mark above a quarter of it would make Linux clamp the TCP window (the peer fails the test at such
    a mark); the buffer's size is read only when a mark is about to change, not before every read."""
    channel, peer = connected(material, segments(1448))
    peer.rcvbuf = 64 * 1024
    body = os.urandom(2_000_000)
    peer.send_records(*(body[i:i + 16384] for i in range(0, len(body), 16384)))
    assert read_frame_rest(channel, len(body)) == body
    assert max(peer.lowats) <= 16 * 1024
    assert peer.rcvbuf_reads <= 2 + peer.recv_calls // 8, (peer.rcvbuf_reads, peer.recv_calls)


@pytest.mark.parametrize("one_piece", [False, True], ids=["separate-pieces", "data-and-alert-in-one-piece"])
def test_close_notify_after_data_delivers_the_data_then_reports_the_closed_session(material, one_piece):
    channel, peer = connected(material, segments(500))
    peer.send_records(b"last words")
    peer.close_notify()
    if one_piece:                 # the second call must not wait on the socket for more: the session is over
        peer.pieces = [b"".join(peer.pieces)]
    buffer = bytearray(100)
    assert bytes(buffer[:channel.recv_into(memoryview(buffer))]) == b"last words"
    with pytest.raises(ConnectionResetError, match="TLS session closed"):
        channel.recv_into(memoryview(buffer))


def test_a_peer_closing_mid_record_is_a_connection_error_not_a_hang(material):
    channel, peer = connected(material, whole)
    peer.send_records(os.urandom(5000))
    peer.pieces = [peer.pieces[0][:3000]]                    # the rest of the record never comes
    peer.closed_after = True
    with pytest.raises(ConnectionResetError, match="closed by the broker during TLS"):
        channel.recv_into(memoryview(bytearray(10_000)))


def _server_plaintext(peer: ScriptedPeer) -> bytes:
    out = bytearray()
    with contextlib.suppress(ssl.SSLWantReadError):
        while True:
            chunk = peer.server.read(1 << 20)
            if not chunk:
                break
            out += chunk
    return bytes(out)


@pytest.mark.parametrize("sizes", [
    (0, 1, _GATHER_BELOW - 1, _GATHER_BELOW, 7),                        # gathered, then a part written alone
    (_SEND_SLICE - 1, _SEND_SLICE, _SEND_SLICE + 1, 3),                 # written whole, then sliced
    (5,) * 4000 + (3 * _SEND_SLICE + 7,),                               # many header pieces, then a large batch
], ids=["around-the-gather-size", "around-the-slice-size", "many-small-then-large"])
def test_a_request_of_parts_on_either_side_of_the_boundaries_arrives_whole_and_in_order(material, sizes):
    channel, peer = connected(material, whole)
    sends: list[int] = []
    sendmsg = peer.sendmsg
    peer.sendmsg = lambda buffers: sends.append(sendmsg(buffers)) or sends[-1]
    parts = [os.urandom(size) for size in sizes]
    parts[-1] = memoryview(bytearray(parts[-1]))                        # a memoryview, as the writer passes batches
    channel.send(parts)
    assert _server_plaintext(peer) == b"".join(bytes(part) for part in parts)
    # the outgoing BIO is drained per slice: no sendmsg carries much more than two slices of ciphertext
    assert max(sends) < 2 * _SEND_SLICE + 64 * 1024
    if sum(sizes) > 2 * _SEND_SLICE:
        assert len(sends) >= 2


def test_a_part_of_wide_items_is_sent_by_its_bytes(material):
    channel, peer = connected(material, whole)
    data = bytearray(os.urandom(4 * (_SEND_SLICE + 12)))        # more than a slice in items too
    channel.send([b"head", memoryview(data).cast("I"), memoryview(b"tail").cast("B")])
    assert _server_plaintext(peer) == b"head" + bytes(data) + b"tail"
