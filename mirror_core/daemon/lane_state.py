"""What the daemon keeps per lane (:class:`LaneState`), what it reports of itself (:class:`DaemonStatus`), and how
often the books it keeps by events are checked against the lanes (:data:`AUDIT_MAX_S`).

A lane is a source partition mirrored to its target partition under one transactional.id. Its state is the main
thread's books: a lane worker's task (opening the lane) sets only ``start``, once; whatever else a worker produced
(a session, a fetcher, an error) is installed by the main thread, and only if ``generation`` did not move meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mirror_core.engine.lane_session import LaneSession
from mirror_core.kafka.fetcher import RawBatchFetcher
from mirror_core.model.lane_status import LaneHealth

# the standing round's and the openings' books audited, and the fence walk: this often, whatever the rescan
# interval. They are nets for a bug in the books kept by events (a drift is repaired and logged), each a walk of
# every held lane: on the rescan cadence (10 s by default) they were most of what an idle round cost per held lane
# (issue #18), though nothing about discovering topics makes a drift likelier or its repair more urgent.
AUDIT_MAX_S = 30.0


@dataclass
class SourceHold:
    """A lane caught up to a source last stable offset that stays below the high watermark: a transaction open at
    ``offset`` holds what follows it from every READ_COMMITTED reader. ``since_ms``: when this process first saw
    the last stable offset there (wall clock; the pipeline's ``open_transaction_alert_s`` counts from it);
    ``high_watermark``: the newest the source reported meanwhile; ``message``: set when the lane was turned
    ``stalled`` for it (and the event logged), kept to turn it so again after a failure in between."""

    offset: int
    since_ms: int
    high_watermark: int
    message: str | None = None

    @property
    def reported(self) -> bool:
        return self.message is not None


@dataclass
class LaneState:
    topic: str
    partition: int
    target_topic: str
    lane: str
    session: LaneSession | None = None
    fetcher: RawBatchFetcher | None = None  # at the session's committed position; dropped with the session
    health: LaneHealth = field(default_factory=LaneHealth)  # what the user sees (lane_status); halted: not reopened
    retry_at: float = 0.0
    failures: int = 0
    start: int | None = None  # where a lane without checkpoint starts (new_partitions), fixed at first sight
    fetch_failures: int = 0
    last_stable: int | None = None  # the source partition's last stable offset at the last fetch
    repaired_at: int | None = None  # source offset of the rejected batch a config sync last repaired
    shown_lag: int | None = None  # the lag gauge's value for the lane (None: not set by this process, or removed)
    hold: SourceHold | None = None  # caught up to a last stable offset an open source transaction holds
    # the lane's halt is stored in its checkpoint (we wrote it, or read it there): from then on a checkpoint of the
    # lane without a halt can only be the operator's resume (no clock is compared: machines' clocks differ)
    halt_stored: bool = False
    # halted because the checkpoint topic partition holding its checkpoint cannot be read (a damaged batch): in this
    # process only, and lifted when that partition reads again (mirror_core.daemon.eligibility)
    checkpoint_unreadable: bool = False
    # bumped whenever the lane is dropped: work a worker began before (an open, a fence renewal, a copy) finds a
    # different number when it returns, and its result (a session, a fetcher, an error) is not this lane's any more
    generation: int = 0

    def reset(self) -> None:
        """Forget the open session and fetch position: the next round reopens the lane (fencing any older writer
        of it, aborting our open transaction) and resumes from the committed checkpoint."""
        self.session = None
        self.fetcher = None


@dataclass
class DaemonStatus:
    lanes_held: list[str] = field(default_factory=list)
    halted: dict[str, str] = field(default_factory=dict)
