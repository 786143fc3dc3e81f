"""The diagnostic thread sampler (issue #18): CPU is charged to the thread *name* that spent it, and the busy
stacks show that thread's code, not an idle one's."""

from __future__ import annotations

import json
import threading
import time

import pytest

from mirror_core.daemon.thread_sampler import ThreadSampler, kind_of


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


@pytest.mark.timeout(30)
def test_cpu_and_stacks_go_to_the_busy_thread_by_name(tmp_path):
    stop = threading.Event()
    busy = threading.Thread(target=_spin, args=(stop,), name="test-busy-7", daemon=True)
    idle = threading.Thread(target=stop.wait, name="test-idle-1", daemon=True)
    sampler = ThreadSampler(tmp_path / "report.json", interval_s=0.02).start()
    busy.start()
    idle.start()
    # spin until the sampler has charged it 0.3 s of CPU (20 s at most): no assumption about how much CPU a loaded
    # machine gives the thread, or when it gives the sampler its turns (CI once saw no sample of a 1 s spin)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        tid = busy.native_id
        if tid in sampler.cpu and sampler.cpu[tid] - sampler.first_cpu[tid] >= 0.3:
            break
        time.sleep(0.05)
    stop.set()
    busy.join(5)
    time.sleep(0.1)  # a sample after it ended
    sampler.stop()
    report = json.loads((tmp_path / "report.json").read_text())
    kinds = report["by_thread_kind"]
    assert kinds["test-busy"]["cpu_s"] >= 0.3, kinds
    assert kinds["test-idle"]["cpu_s"] <= 0.05, kinds
    assert kinds["test-busy"]["ended"] == 1 and kinds["test-idle"]["threads"] == 1
    assert any("_spin" in stack for stack, _ in report["busy_stacks"]["test-busy"])
    assert "test-idle" not in report["busy_stacks"]


def test_worker_index_is_dropped_from_the_kind():
    assert kind_of("shoal-lane-worker-3") == "shoal-lane-worker"
    assert kind_of("rdk:broker1") == "rdk:broker1"
