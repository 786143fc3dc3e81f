"""The direction of imports (docs/architecture.md): ``mirror_core`` ← ``spark_apps``, ``shoal_airflow`` ← ``dags``.
mirror_core never imports Airflow, PySpark or the layers above it, and only the CLI entry point reads the environment;
shoal_airflow never imports the DAG files; no module imports the old package name ``plugins`` (only
shoal_airflow/legacy_paths.py still knows it, for trigger classpaths stored in Airflow databases).

Inside mirror_core, the layers (each a subpackage) import downwards only: config ← codec ← model ← kafka ← state ←
engine ← services ← daemon ← cli, with ``errors`` under all of them and ``dev`` (the sandbox, the demo) imported by
the CLI alone. An import under ``if TYPE_CHECKING:`` names a type, not a dependency, and is not counted. The edges
(``shoal_airflow``, ``spark_apps``, ``dags``) call config, engine and services. What still points the wrong way is
listed below with its reason, and the list is a ratchet: a new wrong-way import fails, and so does an entry that no
longer exists (strike it when it is fixed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "mirror_core"
MODULES = sorted(CORE.rglob("*.py"))
AIRFLOW_MODULES = sorted((ROOT / "shoal_airflow").rglob("*.py"))
EVERY_MODULE = sorted(p for top in ("mirror_core", "shoal_airflow", "spark_apps", "dags", "scripts", "tests", "bench")
                      for p in (ROOT / top).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_mirror_core_imports_neither_airflow_nor_pyspark(path):
    forbidden = _imports(path) & {"airflow", "pyspark", "shoal_airflow", "plugins", "dags", "spark_apps"}
    assert not forbidden, f"{path.name} imports {forbidden}: mirror_core must run without them"


@pytest.mark.parametrize("path", [p for p in MODULES if p.relative_to(CORE) != Path("cli/main.py")],
                         ids=lambda p: str(p.relative_to(CORE)))
def test_only_the_cli_reads_the_environment(path):
    assert "os.environ" not in path.read_text() and "getenv(" not in path.read_text(), \
        f"{path.name} reads the environment; pass settings in from the entry point instead"


@pytest.mark.parametrize("path", AIRFLOW_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shoal_airflow_does_not_import_the_dag_files(path):
    assert not _imports(path) & {"dags"}, f"{path.name} imports dags: DAG files sit on top of shoal_airflow"


@pytest.mark.parametrize("path", EVERY_MODULE, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_imports_the_old_package_name(path):
    assert "plugins" not in _imports(path), f"{path.name} imports `plugins`: the package is shoal_airflow now"


LAYERS = ("config", "codec", "model", "kafka", "state", "engine", "services", "daemon", "cli", "dev")
EDGE_ALLOWED = {"config", "engine", "services"}
# (importing module, imported module) → why it still points the wrong way
CORE_EXCEPTIONS = {
    ("config.pipeline_file", "model.retention_policy"):
        "the pipeline file holds the retention verdict's settings, whose defaults the retention model computes",
}
EDGE_EXCEPTIONS = {
    # the README's local Airflow launcher is development tooling itself: it starts the sandbox clusters it connects
    ("shoal_airflow/local_airflow.py", "dev.sandbox"),
}


def _runtime_core_imports(path: Path) -> set[str]:
    """The ``mirror_core`` modules ``path`` imports at run time (lazy imports included, TYPE_CHECKING blocks not)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "mirror_core":
            if node.module == "mirror_core":
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "mirror_core")
    return found


def _layer_module(dotted: str) -> tuple[str, str] | None:
    """``mirror_core.kafka.writer`` → ("kafka", "kafka.writer"); ``mirror_core.errors`` → None."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return parts[1], ".".join(parts[1:3])


def _wrong_way(path: Path) -> set[tuple[str, str]]:
    own = _layer_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    out = set()
    for dotted in _runtime_core_imports(path):
        other = _layer_module(dotted)
        if own is None or other is None or other[0] == own[0] or (own[0], other[0]) == ("cli", "dev"):
            continue
        if LAYERS.index(other[0]) > LAYERS.index(own[0]):
            out.add((own[1], other[1]))
    return out


def test_every_module_of_mirror_core_sits_in_a_layer():
    flat = sorted(str(p.relative_to(CORE)) for p in CORE.glob("*.py") if p.name not in ("__init__.py", "errors.py"))
    assert not flat, f"modules outside the layers: {flat}; place each in the subpackage of its layer"
    assert sorted(p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists()) == sorted(LAYERS)


def test_mirror_core_imports_point_down_the_layers():
    found = set().union(*(_wrong_way(p) for p in MODULES))
    new = sorted(found - set(CORE_EXCEPTIONS))
    gone = sorted(set(CORE_EXCEPTIONS) - found)
    assert not new, f"imports up the layers (config ← codec ← model ← kafka ← state ← engine ← services ← daemon ← " \
                    f"cli): {new}"
    assert not gone, f"listed as exceptions but no longer there (strike them): {gone}"


def test_edges_call_config_engine_and_services():
    edges = sorted(p for top in ("shoal_airflow", "spark_apps", "dags") for p in (ROOT / top).rglob("*.py"))
    found = set()
    for path in edges:
        for dotted in _runtime_core_imports(path):
            other = _layer_module(dotted)
            if other is not None and other[0] not in EDGE_ALLOWED:
                found.add((str(path.relative_to(ROOT)), other[1]))
    new = sorted(found - EDGE_EXCEPTIONS)
    gone = sorted(EDGE_EXCEPTIONS - found)
    assert not new, f"edges importing below services/ (add a service function instead): {new}"
    assert not gone, f"listed as exceptions but no longer there (strike them): {gone}"


def test_nothing_but_the_cli_imports_the_dev_layer():
    users = sorted(str(p.relative_to(CORE)) for p in MODULES
                   if not str(p.relative_to(CORE)).startswith(("cli/", "dev/"))
                   and any(d.startswith("mirror_core.dev") for d in _runtime_core_imports(p)))
    assert not users, f"production modules importing the sandbox or the demo: {users}"


PURE_LAYERS = ("config", "codec", "model")
# what talks to a network: sockets and TLS, confluent-kafka, and kafka-python's clients and connections (its protocol
# classes, record codecs and error types are pure and allowed)
NETWORK_MODULES = {"socket", "ssl", "select", "selectors", "asyncio", "confluent_kafka", "kafka.conn", "kafka.net",
                   "kafka.client_async", "kafka.admin", "kafka.consumer", "kafka.producer", "kafka.cluster"}


def _all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("path", [p for p in MODULES if p.relative_to(CORE).parts[0] in PURE_LAYERS],
                         ids=lambda p: str(p.relative_to(CORE)))
def test_the_pure_layers_touch_no_network(path):
    network = sorted(name for name in _all_imports(path)
                     if any(name == m or name.startswith(m + ".") for m in NETWORK_MODULES))
    assert not network, f"{path.relative_to(CORE)} imports {network}: config/, codec/ and model/ do no I/O"


def test_only_entry_points_import_the_cli():
    """The CLI parses and prints; library code never imports it. Entry points: the CLI itself, the console script,
    ``python -m mirror_core.cli``, and the scripts and tests that drive it."""
    users = sorted(str(p.relative_to(ROOT)) for p in EVERY_MODULE
                   if p.parts[len(ROOT.parts)] in ("mirror_core", "shoal_airflow", "spark_apps", "dags")
                   and not str(p.relative_to(ROOT)).startswith("mirror_core/cli/")
                   and any(d == "mirror_core.cli" or d.startswith("mirror_core.cli.") for d in _all_imports(p)))
    assert not users, f"library code importing the CLI: {users}"


def test_docs_architecture_names_every_module():
    """docs/architecture.md places every module (its "Every module" list), so a new module is placed when it lands."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = text[text.index("## Every module"):]
    missing = []
    for path in MODULES:
        rel = path.relative_to(CORE)
        if rel.name == "__main__.py" or (rel.name == "__init__.py" and len(rel.parts) <= 2) or len(rel.parts) < 2:
            continue
        layer, name = rel.parts[0], "/".join(rel.with_suffix("").parts[1:])
        if name.endswith("/__init__"):
            name = name[: -len("/__init__")]
        if f"- `{name}` —" not in listed.split(f"**`{layer}/`**")[1].split("**`")[0]:
            missing.append(str(rel))
    assert not missing, f"modules docs/architecture.md does not name: {missing}"
