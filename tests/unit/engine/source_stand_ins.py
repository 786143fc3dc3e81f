"""In-process stand-ins for the copier's unit tests: a source partition log of real v2 batches (data, transactions
committed or aborted, their markers, offsets compacted away), a fetcher that answers from it through the real
:meth:`RawBatchFetcher.handle` (READ_COMMITTED filtering and range bounds as on the wire), and a target writer that
records what lands where. No broker: every answer is built here."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from mirror_core.codec.batch_codec import CONTROL_ABORT, CONTROL_COMMIT, parse_batch
from mirror_core.kafka.fetcher import RawBatchFetcher
from tests.unit.codec.test_batch_codec import CONTROL, build, decoded, patch

TS = 1_700_000_000_000


def _records(first: int, deltas: list[int]) -> list[tuple]:
    return [(d, TS + first + d, b"k%d" % (first + d), b"v%d" % (first + d), []) for d in deltas]


@dataclass
class SourceLog:
    """One source partition's log, appended batch by batch. ``committed`` are the offsets a READ_COMMITTED
    consumer reads, in order: what a correct copy puts on the target, and nothing else."""

    start: int = 0
    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # (first offset, next offset, raw)
    committed: list[int] = field(default_factory=list)
    aborted: list[tuple[int, int, int]] = field(default_factory=list)  # (producer id, first offset, marker offset)
    next: int = -1
    _open: dict[int, tuple[int, list[int]]] = field(default_factory=dict)  # producer -> (first offset, offsets)

    def __post_init__(self):
        self.next = self.start

    def _append(self, raw: bytes) -> tuple[int, int]:
        view = parse_batch(raw)
        self.batches.append((view.base_offset, view.next_offset, raw))
        self.next = view.next_offset
        return view.base_offset, view.next_offset

    def data(self, n: int = 1, *, deltas: list[int] | None = None) -> list[int]:
        """A plain batch of ``n`` records (or records at ``deltas``: a compacted batch with holes)."""
        deltas = list(range(n)) if deltas is None else deltas
        first = self.next
        raw = build(_records(first, deltas), base_offset=first)
        if deltas[-1] + 1 > len(deltas) or deltas[0]:
            raw = patch(raw, last_offset_delta=deltas[-1])
        self._append(raw)
        self.next = first + deltas[-1] + 1
        offsets = [first + d for d in deltas]
        self.committed += offsets
        return offsets

    def txn(self, producer: int, n: int = 1) -> None:
        """A transactional batch of ``producer``'s open transaction (decided by :meth:`commit` or :meth:`abort`)."""
        first = self.next
        self._append(build(_records(first, list(range(n))), base_offset=first, transactional=True,
                           producer=(producer, 0, 0)))
        begun, offsets = self._open.get(producer, (first, []))
        self._open[producer] = (begun, offsets + list(range(first, first + n)))

    def _marker(self, producer: int, kind: int) -> int:
        key = kind.to_bytes(4, "big")  # version 0, type
        raw = build([(0, TS, key, b"\x00\x00\x00\x00\x00\x00", [])], base_offset=self.next, transactional=True,
                    producer=(producer, 0, 0))
        first, _ = self._append(patch(raw, set_bits=CONTROL))
        return first

    def commit(self, producer: int) -> None:
        _, offsets = self._open.pop(producer)
        self._marker(producer, CONTROL_COMMIT)
        self.committed += offsets

    def abort(self, producer: int) -> None:
        begun, _ = self._open.pop(producer)
        self.aborted.append((producer, begun, self._marker(producer, CONTROL_ABORT)))

    def skip(self, n: int) -> None:
        """Offsets removed by compaction between two batches."""
        self.next += n

    def answer(self, position: int, max_batches: int) -> SimpleNamespace:
        """A Fetch answer at ``position``: up to ``max_batches`` batches from the one holding it, with the aborted
        transactions that overlap them, as a partition of a READ_COMMITTED Fetch response."""
        stable = min([self.next] + [begun for begun, _ in self._open.values()])
        # READ_COMMITTED: nothing at or above the last stable offset is answered
        chosen = [b for b in self.batches if b[1] > position and b[0] < stable][:max_batches]
        frame = bytearray(b"".join(raw for _, _, raw in chosen))
        lo, hi = (chosen[0][0], chosen[-1][1]) if chosen else (position, position)
        txns = [SimpleNamespace(producer_id=p, first_offset=f) for p, f, m in self.aborted if f < hi and m >= lo]
        return SimpleNamespace(error_code=0, records=memoryview(frame), aborted_transactions=txns,
                               high_watermark=self.next, last_stable_offset=stable, log_start_offset=self.start,
                               diverging_epoch=None)


class Cluster:
    def __init__(self, name: str):
        self.cluster_name = name


class LogFetcher(RawBatchFetcher):
    """The real fetcher's answer handling over :class:`SourceLog` answers of ``per_answer`` batches. ``prefetch``
    only records that it was asked (there is no wire to send on); ``sent`` lists the positions it was asked at.
    A copy asking more than ``max_answers`` times is spinning: the fetch fails the test instead of hanging it."""

    def __init__(self, log: SourceLog, start: int, end: int | None, *, per_answer: int = 2, cluster: str = "src",
                 topic: str = "orders", partition: int = 3, last_epoch: int | None = None, max_answers: int = 200):
        super().__init__(Cluster(cluster), topic, partition, start, end, last_epoch=last_epoch)
        self.log, self.per_answer, self.max_answers = log, per_answer, max_answers
        self.sent: list[int] = []
        self.answers = 0

    def prefetch(self) -> bool:
        if self.done:
            return False
        self.sent.append(self.position)
        self._prefetched = (self.position, None, None)
        return True

    def _fetch_once(self, resent: bool = False):
        self._prefetched = None
        assert self.answers < self.max_answers, "the copy keeps fetching instead of halting or finishing"
        self.answers += 1
        return self.handle(self.log.answer(self.position, self.per_answer))


@dataclass
class Landed:
    target_offset: int
    source_offset: int  # from the record's key, which the source log wrote as k<source offset>
    value: bytes


class RecordingWriter:
    """The target partition: each batch lands at the next offset (``gaps`` adds offsets before a given write call,
    as another writer's records would; ``ack_unknown`` answers -1 for a given call, as a broker answering
    "duplicate" does; ``fail_on`` raises on a given call), and every record landed is kept in order."""

    def __init__(self, *, first: int = 0, gaps: dict[int, int] | None = None, ack_unknown: set[int] = frozenset(),
                 fail_on: int | None = None):
        self.next = first
        self.landed: list[Landed] = []
        self.calls: list[int] = []  # batches per write call
        self.gaps, self.ack_unknown, self.fail_on = gaps or {}, ack_unknown, fail_on

    def write(self, outgoing) -> list[int]:
        call = len(self.calls)
        if call == self.fail_on:
            raise ConnectionError("target unreachable")
        self.calls.append(len(outgoing))
        self.next += self.gaps.get(call, 0)
        bases = []
        for batch in outgoing:
            records = decoded(bytes(batch.data))
            bases.append(-1 if call in self.ack_unknown else self.next)
            for i, (_, _, key, value, _) in enumerate(records):
                self.landed.append(Landed(self.next + i, int(key[1:]), value))
            self.next += len(records)
        return bases

    @property
    def source_offsets(self) -> list[int]:
        return [r.source_offset for r in self.landed]


class StreamingWriter(RecordingWriter):
    """A :class:`RecordingWriter` that also takes a write a batch at a time (``stream()``, as ``BatchWriter`` does):
    the batches given to a stream land when it is finished, as one write call; ``added`` keeps, per stream, how
    many batches had been given when it was finished (or settled); ``settled`` counts streams given up."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.added: list[int] = []
        self.settled = 0
        self.open: _Stream | None = None

    def stream(self):
        if self.open is not None:
            raise AssertionError("a second stream opened before the first was finished or settled")
        self.open = _Stream(self)
        return self.open


class _Stream:
    def __init__(self, writer: StreamingWriter):
        self.writer, self.batches, self.done = writer, [], False

    def __len__(self) -> int:
        return len(self.batches)

    def add(self, batch) -> None:
        assert not self.done
        self.batches.append(batch)

    def finish(self) -> list[int]:
        assert not self.done
        self.done, self.writer.open = True, None
        self.writer.added.append(len(self.batches))
        return self.writer.write(self.batches)

    def settle(self) -> None:
        if not self.done:
            self.done, self.writer.open = True, None
            self.writer.added.append(len(self.batches))
            self.writer.settled += 1
