"""Starts, stops and restarts the nodes of a replicated sandbox cluster (:class:`~.spec.QuorumSpec`).

Tests that need leader changes (an unclean leader election truncating a partition's log) use one: a controller-only
KRaft node and two brokers, each a JVM of its own, under ``<sandbox>/<cluster>/<cluster>-<node id>/`` with the same
files as a single-node cluster (:mod:`.broker`). The nodes share one cluster id, kept in
``<sandbox>/<cluster>/cluster.id``. Nothing starts it but its caller (a test fixture), which also stops it.

Invariant: as for :class:`~.broker.SandboxBroker`, a node's pid file names a process only while that process runs
the node's own ``server.properties``, so stopping never kills a stranger.
"""

from __future__ import annotations

import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mirror_core.dev.sandbox.broker import BrokerStatus, SandboxBroker, new_cluster_id
from mirror_core.dev.sandbox.spec import QUORUM_CLUSTERS, QuorumNodeSpec, QuorumSpec, render_quorum_node_properties
from mirror_core.errors import ConfigError, SandboxError


class QuorumNode(SandboxBroker):
    """One node (controller-only or broker) of a :class:`QuorumCluster`."""

    spec: QuorumNodeSpec

    def __init__(self, spec: QuorumNodeSpec, cluster_home: Path, cache_dir: Path, cluster_id_file: Path):
        super().__init__(spec, cluster_home, cache_dir)
        self._cluster_id_file = cluster_id_file

    def _render_properties(self, tls_meta: dict | None, users: dict[str, str] | None = None) -> str:
        return render_quorum_node_properties(self.spec, data_dir=str(self.data_dir))

    def _new_cluster_id(self) -> str:
        return self._cluster_id_file.read_text().strip()

    def answers(self, timeout: float = 2.0) -> bool:
        if not self.spec.controller_only:
            return super().answers(timeout)
        try:  # a controller-only node has no client listener: accepting on its controller port is enough
            with socket.create_connection(("127.0.0.1", self.spec.port), timeout=timeout):
                return True
        except OSError:
            return False


class QuorumCluster:
    """A replicated sandbox cluster: node 1 the controller, nodes 2.. brokers (see the module docstring)."""

    def __init__(self, spec: QuorumSpec, sandbox_dir: Path, cache_dir: Path):
        self.spec = spec
        self.home = Path(sandbox_dir).resolve() / spec.name
        self.cluster_id_file = self.home / "cluster.id"
        self.controller = QuorumNode(spec.controller(), self.home, Path(cache_dir), self.cluster_id_file)
        self.brokers = {node.node_id: QuorumNode(node, self.home, Path(cache_dir), self.cluster_id_file)
                        for node in spec.brokers()}

    @classmethod
    def named(cls, name: str, sandbox_dir: Path, cache_dir: Path) -> QuorumCluster:
        if name not in QUORUM_CLUSTERS:
            raise ConfigError(f"unknown replicated sandbox cluster {name!r}; known: {', '.join(QUORUM_CLUSTERS)}")
        return cls(QUORUM_CLUSTERS[name], sandbox_dir, cache_dir)

    @property
    def bootstrap(self) -> str:
        return self.spec.bootstrap

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def broker(self, node_id: int) -> QuorumNode:
        if node_id not in self.brokers:
            raise ConfigError(f"cluster {self.spec.name!r} has brokers {sorted(self.brokers)}, not {node_id}")
        return self.brokers[node_id]

    def start(self, *, timeout: float = 90.0) -> list[BrokerStatus]:
        """Start the controller, then every broker in parallel; formats the storage on a first start."""
        self.controller.resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.cluster_id_file.exists():
            self.cluster_id_file.write_text(new_cluster_id())
        statuses = [self.controller.start(timeout=timeout)]
        with ThreadPoolExecutor(max_workers=len(self.brokers)) as pool:
            futures = [pool.submit(node.start, timeout=timeout) for node in self.brokers.values()]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise SandboxError(f"replicated sandbox cluster {self.spec.name!r} did not start: {errors[0]}")
        return statuses + [f.result() for f in futures]

    def stop(self) -> list[str]:
        """Stop every node (brokers first, so they shut down cleanly through the controller)."""
        stopped = [node.spec.name for node in self.brokers.values() if node.stop()]
        if self.controller.stop():
            stopped.append(self.controller.spec.name)
        return stopped

    def wipe(self) -> None:
        """Stop every node and delete the cluster's files (data, logs, cluster id)."""
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
