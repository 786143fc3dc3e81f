"""The daemon's lane worker pool: a lane always runs on one worker thread with that worker's own clients, lanes run
side by side, one task's exception is its own outcome, and the caller's tick runs while it waits."""

from __future__ import annotations

import threading
import time

import pytest

from mirror_core.daemon.lane_workers import LaneClients, LaneWorkerPool


def _pool(size: int, made: list) -> LaneWorkerPool:
    def make_clients() -> LaneClients:
        clients = LaneClients(source=object(), target=object(), store=threading.current_thread().name)
        made.append(clients)
        return clients

    return LaneWorkerPool(size, make_clients)


@pytest.mark.timeout(10)
def test_a_lane_always_runs_on_the_same_worker_thread_with_its_clients():
    made: list = []
    pool = _pool(3, made)
    try:
        seen: dict[str, set] = {}

        def task(lane):
            def run(clients):
                assert clients.store == threading.current_thread().name  # made on the thread that uses them
                seen.setdefault(lane, set()).add((threading.current_thread().name, id(clients)))
                return lane
            return run

        for _ in range(4):
            outcomes = pool.run([(lane, task(lane)) for lane in ("a", "b", "c", "d", "e")])
            assert [o.value for o in outcomes] == ["a", "b", "c", "d", "e"]
        assert all(len(places) == 1 for places in seen.values()), seen
        assert len({next(iter(p))[0] for p in seen.values()}) == 3, "five lanes spread over the three workers"
        assert len(made) == 3
    finally:
        pool.close()


@pytest.mark.timeout(10)
def test_lanes_run_side_by_side_and_a_failure_stays_with_its_lane():
    pool = _pool(4, [])
    barrier = threading.Barrier(4, timeout=5)  # only passes if four lanes' tasks run at the same time

    def waits(_clients):
        barrier.wait()
        return "ok"

    def fails(_clients):
        barrier.wait()
        raise RuntimeError("lane c: commit refused")

    ticks = []
    try:
        outcomes = pool.run([("a", waits), ("b", waits), ("c", fails), ("d", waits)],
                            tick=lambda: ticks.append(time.monotonic()))
    finally:
        pool.close()
    assert [o.ok for o in outcomes] == [True, True, False, True]
    assert [o.value for o in outcomes if o.ok] == ["ok"] * 3
    assert "lane c" in str(outcomes[2].error)
    assert ticks, "the caller's tick (lease renewal) ran while it waited"


@pytest.mark.timeout(10)
def test_one_lanes_tasks_run_in_the_given_order():
    pool = _pool(2, [])
    order = []

    def step(i):
        def run(_clients):
            time.sleep(0.01 * (3 - i))
            order.append(i)
        return run

    try:
        pool.run([("a", step(0)), ("a", step(1)), ("a", step(2))])
    finally:
        pool.close()
    assert order == [0, 1, 2]


@pytest.mark.timeout(10)
def test_lanes_given_up_free_their_worker_so_new_lanes_spread_evenly():
    pool = _pool(2, [])
    try:
        pool.run([(lane, lambda clients: None) for lane in ("a", "b", "c", "d")])
        freed = pool.worker_for("a")
        assert pool.worker_for("c") == freed != pool.worker_for("b") == pool.worker_for("d")
        for lane in ("a", "c"):  # both lanes of one worker move to another daemon
            pool.release(lane)
        pool.release("never-seen")  # nothing bound: nothing to release
        workers = {lane: pool.worker_for(lane) for lane in ("e", "f")}
        assert workers == {"e": freed, "f": freed}, f"new lanes {workers} went to the busier worker"
    finally:
        pool.close()


@pytest.mark.timeout(10)
def test_a_finished_task_and_its_data_are_not_held_by_its_worker():
    """The pool holds nothing across calls: a worker waiting for its next task must not keep its last one (a
    daemon's lane task carries the lane's share of a fetch round, a view into the whole fetch answer). Before the
    fix each worker kept its last task until its next one came, so a daemon whose rounds rotate over the partitions
    (one partition filling a link-sized round) kept one whole fetch answer alive per worker, rounds apart: 6 answers
    of 16.8 MB instead of 2 (docs/performance.md, "Daemon memory")."""
    import gc
    import weakref

    class Share(bytearray):   # a round's data, as a lane task carries it (bytearray itself has no weak references)
        pass

    pool = _pool(2, [])
    try:
        share = Share(1 << 20)
        held = weakref.ref(share)

        def copy(_clients, data=share):
            return len(data)

        outcomes = pool.run([("a", copy)])
        assert outcomes[0].value == 1 << 20
        del copy, share, outcomes
        gc.collect()
        assert held() is None, "the worker still holds its finished task's data"
    finally:
        pool.close()
