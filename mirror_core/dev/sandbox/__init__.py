"""Shoal's local Kafka sandbox: named single-node KRaft clusters started as JVM processes on loopback.

``source`` and ``target`` (newest Kafka 4.x, each also with a SASL_SSL listener: PLAIN and SCRAM users, a
throw-away CA per cluster) are the default pair; ``legacy`` runs Kafka 3.9 for cross-version work. Used by
``shoal sandbox up|down|status``, the README's main job and the test suite. ``replicated`` (a controller-only node
and two brokers, :mod:`.quorum`) is started only by the tests that need leader changes, through
:meth:`Sandbox.replicated`. Files: ``<sandbox_dir>/<cluster>/`` (see :mod:`.broker`); jars are cached under
``<cache_dir>/kafka/<version>/lib``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from mirror_core.dev.sandbox.broker import BrokerStatus, SandboxBroker
from mirror_core.dev.sandbox.quorum import QuorumCluster
from mirror_core.dev.sandbox.spec import CLUSTERS, DEFAULT_CLUSTERS, ClusterSpec
from mirror_core.errors import ConfigError, SandboxError

__all__ = ["CLUSTERS", "DEFAULT_CLUSTERS", "BrokerStatus", "ClusterSpec", "QuorumCluster", "Sandbox",
           "SandboxBroker"]


class Sandbox:
    """The set of sandbox clusters living under one directory."""

    def __init__(self, sandbox_dir: Path, cache_dir: Path):
        self.sandbox_dir = Path(sandbox_dir).resolve()
        self.cache_dir = Path(cache_dir).resolve()

    def broker(self, name: str) -> SandboxBroker:
        if name not in CLUSTERS:
            raise ConfigError(f"unknown sandbox cluster {name!r}; known: {', '.join(CLUSTERS)}")
        return SandboxBroker(CLUSTERS[name], self.sandbox_dir, self.cache_dir)

    def replicated(self, name: str = "replicated") -> QuorumCluster:
        """A replicated cluster of this sandbox (not started: its caller starts and stops it)."""
        return QuorumCluster.named(name, self.sandbox_dir, self.cache_dir)

    def up(self, names: Iterable[str] = DEFAULT_CLUSTERS, *, timeout: float = 90.0) -> list[BrokerStatus]:
        """Start the named clusters in parallel (reusing any that already run).

        All or error: the first failure is raised with its broker log's tail; the others are left running.
        """
        from concurrent.futures import ThreadPoolExecutor

        brokers = [self.broker(n) for n in names]
        for b in brokers:  # resolve each version's jars once, before the parallel starts race for them
            b.resolve()
        with ThreadPoolExecutor(max_workers=len(brokers) or 1) as pool:
            futures = [pool.submit(b.start, timeout=timeout) for b in brokers]
        return [f.result() for f in futures]

    def down(self, names: Iterable[str] | None = None) -> list[str]:
        """Stop the named clusters (default: every known one); returns the names that were running."""
        stopped = []
        for name in names or CLUSTERS:
            if self.broker(name).stop():
                stopped.append(name)
        return stopped

    def status(self, names: Iterable[str] | None = None) -> list[BrokerStatus]:
        return [self.broker(n).status() for n in (names or CLUSTERS)]

    def write_clusters_file(self) -> Path:
        """``<sandbox>/clusters.yaml``: every running cluster's PLAINTEXT settings (and ``<name>-secure``), in the
        clusters-file format the backfill job reads. Private to the user (0600): it holds the SCRAM password."""
        import yaml

        clusters: dict[str, dict[str, str]] = {}
        for status in self.status():
            if status.running:
                clusters[status.name] = self.client_config(status.name)
                # a broker started before its spec gained a secure listener has none until it restarts
                if status.secure_bootstrap and "secure" in self.broker(status.name).info():
                    clusters[f"{status.name}-secure"] = self.client_config(status.name, secure=True)
        path = self.sandbox_dir / "clusters.yaml"
        path.touch(mode=0o600, exist_ok=True)
        path.write_text(yaml.safe_dump(clusters))
        return path

    def client_config(self, name: str, *, secure: bool = False, user: str = "shoal") -> dict[str, str]:
        """A librdkafka-style client config for cluster ``name`` (the format of Airflow's ``kafka`` connection)."""
        info = self.broker(name).info()
        if not secure:
            return {"bootstrap.servers": info["bootstrap"]}
        sec = info.get("secure")
        if sec is None:
            raise SandboxError(f"sandbox cluster {name!r} has no SASL_SSL listener")
        if user not in sec["users"]:
            raise ConfigError(f"sandbox cluster {name!r} has no SCRAM user {user!r}; users: {', '.join(sec['users'])}")
        return {"bootstrap.servers": sec["bootstrap"], "security.protocol": sec["security.protocol"],
                "sasl.mechanism": sec["sasl.mechanism"], "sasl.username": user,
                "sasl.password": sec["users"][user], "ssl.ca.location": sec["ssl.ca.location"]}


def sandbox_from_environ(environ: Mapping[str, str]):
    """The sandbox this invocation manages: ``$SHOAL_SANDBOX_DIR``, else ``.sandbox`` in the project checkout
    (or ``~/.local/state/shoal/sandbox`` for an installed package); jars cache in ``$SHOAL_CACHE_DIR`` or
    ``~/.cache/shoal``."""
    from mirror_core.dev.sandbox import Sandbox

    home = Path(environ.get("HOME", str(Path.home())))
    checkout = Path(__file__).resolve().parents[3]  # mirror_core/dev/sandbox/__init__.py → the checkout
    default_dir = checkout / ".sandbox" if (checkout / "pyproject.toml").exists() \
        else home / ".local" / "state" / "shoal" / "sandbox"
    sandbox_dir = Path(environ.get("SHOAL_SANDBOX_DIR") or default_dir)
    cache_dir = Path(environ.get("SHOAL_CACHE_DIR") or home / ".cache" / "shoal")
    return Sandbox(sandbox_dir, cache_dir)
