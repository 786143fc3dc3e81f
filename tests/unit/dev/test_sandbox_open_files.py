"""The open-file limit a sandbox broker's JVM gets (mirror_core.dev.sandbox.broker): the choice is pure; raising it is
checked on a real child process (prlimit), the way the launcher applies it to the broker."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from mirror_core.dev.sandbox.broker import (
    NOFILE_WHEN_UNLIMITED,
    broker_open_files,
    process_open_files,
    raise_open_files,
)


@pytest.mark.parametrize(("soft", "hard", "wanted"), [
    (1024, 524288, 524288),          # raised to the hard limit
    (20000, 20000, 20000),           # nothing higher allowed: kept
    (1024, resource.RLIM_INFINITY, NOFILE_WHEN_UNLIMITED),
    (4 * NOFILE_WHEN_UNLIMITED, resource.RLIM_INFINITY, 4 * NOFILE_WHEN_UNLIMITED),  # never lowered
])
def test_broker_gets_the_hard_open_file_limit(soft, hard, wanted):
    assert broker_open_files(soft, hard) == wanted


@pytest.mark.timeout(30)
def test_raise_open_files_on_a_child_process():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 256)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard)))
    try:
        assert process_open_files(child.pid) == lowered
        said = raise_open_files(child.pid)
        expected = broker_open_files(lowered, hard)
        assert process_open_files(child.pid) == expected
        assert f"(pid {child.pid}): {expected} (was {lowered}" in said
    finally:
        child.kill()
        child.wait()
