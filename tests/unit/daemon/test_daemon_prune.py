"""The prune watch's hand-over between the copy loop and its thread (no I/O: gathering is not called here)."""

from mirror_core.daemon.prune_watch import PruneWatch


class _Metrics:
    errors = None


def test_a_partition_new_to_the_watch_wakes_it_and_known_ones_do_not():
    watch = PruneWatch(None, _Metrics(), interval_s=300)
    watch.publish({("t", 0)})
    assert watch._wake.is_set()
    watch._wake.clear()
    watch.publish({("t", 0)})
    assert not watch._wake.is_set(), "re-publishing the same partitions must not make the watch gather again"
    watch._floors = {("t", 0): 10}
    watch.publish({("t", 0), ("t", 1)})
    assert watch._wake.is_set()


def test_floors_are_a_copy_and_stop_wakes_the_thread():
    watch = PruneWatch(None, _Metrics(), interval_s=300)
    watch._floors = {("t", 0): 5}
    floors = watch.floors()
    floors[("t", 0)] = 99
    assert watch.floors() == {("t", 0): 5}
    watch.stop()
    assert watch._wake.is_set() and watch._stop.is_set()
