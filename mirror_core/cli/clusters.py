"""What ``--source`` / ``--target`` name on the command line: a sandbox cluster, a YAML/JSON file of librdkafka
settings, or a bare ``host:port`` bootstrap (:func:`resolve_cluster`), shared by every command.
"""

from __future__ import annotations

from pathlib import Path

from mirror_core.errors import ConfigError


def resolve_cluster(spec: str, sandbox, *, role: str):
    """A cluster from a sandbox name, a YAML/JSON settings file, or a bare ``host:port`` bootstrap."""
    from mirror_core.config.cluster import ClusterConfig
    from mirror_core.dev.sandbox import CLUSTERS

    path = Path(spec)
    if path.is_file():
        import yaml

        try:
            settings = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"--{role} {spec}: not valid YAML/JSON ({exc})") from None
        if not isinstance(settings, dict):
            raise ConfigError(f"--{role} {spec}: expected a mapping of librdkafka settings")
        return ClusterConfig(path.stem, {str(k): str(v) for k, v in settings.items()})
    if spec in CLUSTERS:
        return ClusterConfig(spec, sandbox.client_config(spec))
    if ":" in spec:
        return ClusterConfig(role, {"bootstrap.servers": spec})
    raise ConfigError(f"--{role} {spec!r} is neither a settings file, a sandbox cluster ({', '.join(CLUSTERS)}) "
                      "nor host:port")
