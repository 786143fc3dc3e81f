"""``shoal mirror`` whose metrics port is taken (a second daemon on the same machine, say) ends with a clear error
naming the pipeline, the address and what to change — not a stack trace — and before joining anything."""

from __future__ import annotations

import socket

import pytest
import yaml

from mirror_core.daemon.main import run_daemon


@pytest.mark.timeout(20)
def test_a_taken_metrics_port_is_a_clear_error(tmp_path, capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({
        "pipeline": "ports", "source": {"bootstrap.servers": "127.0.0.1:1"},
        "target": {"bootstrap.servers": "127.0.0.1:1"}, "include": "orders.*", "metrics_port": port}))
    try:
        assert run_daemon(str(config)) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert f"pipeline 'ports': cannot serve /metrics on 127.0.0.1:{port} (Address already in use)" in err
    assert "metrics_port" in err and "Traceback" not in err
