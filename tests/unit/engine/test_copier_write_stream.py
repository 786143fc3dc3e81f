"""The copier with a real writer that streams (``BatchWriter.stream``) against the scripted broker of
``test_writer_fast_route_faults``: a copy that fails on the source side while the target fenced its writer reports
the fence (the lane is no longer ours), not only the source error. (Found by review: the fence was taken while
the stream was given up and logged at debug level, so a fenced lane looked like a source failure.)"""

from __future__ import annotations

import time

import kafka.errors as Errors
import pytest

from mirror_core.engine.copier import CopyOptions, RangeCopier
from mirror_core.errors import MirrorError, ProducerFencedError
from mirror_core.kafka.writer import BatchWriter
from mirror_core.model.ranges import PartitionRange
from tests.unit.engine.source_stand_ins import Cluster, LogFetcher, SourceLog
from tests.unit.kafka import test_writer_fast_route_faults as faults

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class _SourceFailsAt(LogFetcher):
    """Answers one batch per fetch, pausing before each after the first (the target's answers arrive meanwhile);
    the ``fail_at``-th fetch raises, as a source outage would."""

    def __init__(self, *args, fail_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at, self.calls = fail_at, 0

    def fetch(self):
        self.calls += 1
        if self.calls == self.fail_at:
            raise MirrorError("source: fetch failed")
        if self.calls > 1:
            time.sleep(0.05)
        return super().fetch()


def _copy(script, fail_at):
    log = SourceLog()
    for _ in range(10):
        log.data(1)
    tp = ("dr.orders", 3)
    cluster = faults.Cluster({tp: 1}, {tp: script})
    client = faults.FastClient(cluster)
    try:
        writer = BatchWriter(client, retry_timeout_s=5)
        copier = RangeCopier(Cluster("src"), client, writer, CopyOptions(overlap=True))
        fetcher = _SourceFailsAt(log, 0, 10, per_answer=1, fail_at=fail_at)
        with pytest.raises(Exception) as caught:
            copier.copy(PartitionRange("orders", 3, 0, 10, "dr.orders", 3), fetcher=fetcher)
        return caught.value, writer
    finally:
        client.close()
        cluster.close()


def test_a_fence_answered_while_the_copy_fails_on_the_source_is_what_the_caller_sees():
    error, _ = _copy([0, 0, Errors.InvalidProducerEpochError.errno], fail_at=4)
    assert isinstance(error, ProducerFencedError)
    assert "source: fetch failed" in str(error.__cause__)


def test_a_source_failure_with_clean_answers_in_flight_is_raised_as_it_is():
    error, writer = _copy([], fail_at=4)
    assert isinstance(error, MirrorError) and str(error) == "source: fetch failed"
    assert not writer._sequences_unknown                    # every batch sent was acknowledged while settling
