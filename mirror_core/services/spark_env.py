"""What Spark executors need to run Shoal's tasks on a remote cluster, packed for ``spark-submit``.

A ``local[N]`` master runs tasks in the driver's own interpreter. A remote master (``spark://``, ``k8s://``,
``yarn``) runs them on other machines, where the driver's interpreter path means nothing, so the job ships what the
tasks import, the way Spark's "Python Package Management" guide describes:

- an **environment archive** (``--archives <archive>#environment``): a minimal virtual environment holding the
  third-party distributions the tasks import (:data:`EXECUTOR_DISTRIBUTIONS` and what they require), copied file by
  file from the driver's interpreter so the versions match exactly; executors unpack it into their working
  directory and run ``./environment/bin/python`` (``spark.pyspark.python``);
- the **code zip** (``--py-files``): ``mirror_core`` and ``spark_apps``, made fresh for every submit.

Like ``venv-pack``, the archive links ``bin/python`` to the driver's base interpreter by absolute path: every node
needs that same Python at that same path (every container of the image built from ``docker/Dockerfile`` has it).
PySpark itself is not packed: Spark puts its own ``pyspark.zip`` on the Python workers' path.

The archive depends only on the interpreter and the distributions' versions, so it is built once per machine and
cached (:func:`executor_environment`); the first build takes a few seconds (about 40 MB of files).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mirror_core.errors import ConfigError

# Third-party distributions a backfill task imports (mirror_core.engine.backfill and kafka-python's codecs). A unit test
# imports the task's modules in a clean interpreter and checks this list covers them.
EXECUTOR_DISTRIBUTIONS = ("kafka-python", "crc32c", "cramjam", "python-snappy", "lz4", "zstandard", "xxhash")
CODE_PACKAGES = ("mirror_core", "spark_apps")
ARCHIVE_ALIAS = "environment"  # the directory executors unpack the archive into (``#environment``)
EXECUTOR_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"


@dataclass(frozen=True)
class Shipment:
    """What a remote submit ships: the environment archive and the code zip."""

    environment: Path
    code: Path

    def submit_args(self, driver_python: str) -> list[str]:
        """spark-submit options: executors run the unpacked archive's Python; the driver keeps its own."""
        return ["--archives", f"{self.environment}#{ARCHIVE_ALIAS}", "--py-files", str(self.code),
                "--conf", f"spark.pyspark.python={EXECUTOR_PYTHON}",
                "--conf", f"spark.pyspark.driver.python={driver_python}"]


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: tasks run in the driver's interpreter."""
    return re.fullmatch(r"local(\[[^\]]*\])?", master.strip()) is not None


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """``SHOAL_SPARK_ENV_DIR``, else ``<interpreter prefix>/shoal-spark-env`` when writable (a project venv: once
    per machine), else ``~/.cache/shoal/spark-env``."""
    if environ.get("SHOAL_SPARK_ENV_DIR"):
        return Path(environ["SHOAL_SPARK_ENV_DIR"])
    prefix = Path(sys.prefix)
    if (prefix / "shoal-spark-env").is_dir() or os.access(prefix, os.W_OK):
        return prefix / "shoal-spark-env"
    return Path.home() / ".cache" / "shoal" / "spark-env"


def distribution_closure(roots: tuple[str, ...] = EXECUTOR_DISTRIBUTIONS) -> list[md.Distribution]:
    """The installed distributions ``roots`` need, requirements followed (extras and non-matching markers not)."""
    from packaging.requirements import Requirement

    found: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _canonical(todo.pop())
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise ConfigError(f"distribution {name!r}, needed by Spark executors, is not installed in "
                              f"{sys.prefix}") from None
        found[name] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [found[n] for n in sorted(found)]


def executor_environment(cache_dir: Path) -> Path:
    """The cached environment archive for this interpreter and these distribution versions, built if missing."""
    dists = distribution_closure()
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    identity = {"python": sys.version, "base": str(base),
                "dists": sorted(f"{d.metadata['Name']}=={d.version}" for d in dists)}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    archive = cache_dir / f"shoal-executor-env-py{sys.version_info[0]}{sys.version_info[1]}-{key}.tar.gz"
    if archive.is_file():
        return archive
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as tmp:
        root = Path(tmp) / ARCHIVE_ALIAS
        _lay_out_venv(root, base, dists)
        partial = Path(tmp) / archive.name
        with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
            for child in sorted(root.iterdir()):
                tar.add(child, arcname=child.name)  # members at the root: Spark unpacks into ./environment
        os.replace(partial, archive)  # atomic: concurrent submits see a whole archive or none
    return archive


def code_zip(dest_dir: Path) -> Path:
    """``mirror_core`` and ``spark_apps`` as one zip for ``--py-files`` (fresh per submit: the code changes)."""
    import importlib.util

    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / "shoal-code.zip"
    with zipfile.ZipFile(out.with_suffix(".zip.partial"), "w", zipfile.ZIP_DEFLATED) as zf:
        for name in CODE_PACKAGES:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                raise ConfigError(f"the {name} package is not installed next to mirror_core")
            pkg = Path(spec.origin).parent
            for path in sorted(pkg.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    zf.write(path, f"{name}/{path.relative_to(pkg).as_posix()}")
    os.replace(out.with_suffix(".zip.partial"), out)
    return out


def ship(cache_dir: Path, work_dir: Path) -> Shipment:
    """Everything a remote submit needs: the cached environment archive and a fresh code zip under ``work_dir``."""
    return Shipment(executor_environment(cache_dir), code_zip(work_dir))


def _lay_out_venv(root: Path, base: Path, dists: list[md.Distribution]) -> None:
    tag = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = root / "lib" / tag / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(base)
    (root / "bin" / "python3").symlink_to("python")
    (root / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n"
                                     f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    for dist in dists:
        origin = Path(dist.locate_file(""))
        for rel in dist.files or ():
            source = Path(dist.locate_file(rel))
            if rel.parts[0] == ".." or "__pycache__" in rel.parts or not source.is_file():
                continue  # scripts outside site-packages and byte code are not needed by tasks
            dest = site / source.relative_to(origin)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
