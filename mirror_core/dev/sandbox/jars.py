"""Resolves a Kafka broker's classpath from Maven Central with Maven and the committed ``pom.xml``.

Jars are cached per version under ``<cache>/kafka/<version>/lib`` (default ``~/.cache/shoal``) and never committed.
A ``.complete`` marker is written only after Maven succeeded, so an interrupted download is redone, not trusted.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mirror_core.dev.sandbox.spec import ClusterSpec
from mirror_core.errors import SandboxError

POM = Path(__file__).with_name("pom.xml")


def resolve_classpath(spec: ClusterSpec, cache_dir: Path) -> Path:
    """Directory holding every runtime jar of Kafka ``spec.version`` plus its logging runtime."""
    lib = cache_dir / "kafka" / spec.version / "lib"
    marker = lib / ".complete"
    if marker.exists():
        return lib
    if shutil.which("java") is None:
        raise SandboxError("Java is not installed or not on PATH; the sandbox needs a JDK 17+ to run Kafka")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SandboxError("Maven (mvn) is not on PATH; the sandbox resolves Kafka from Maven Central with it")
    if lib.exists():
        shutil.rmtree(lib)
    lib.mkdir(parents=True)
    cmd = [mvn, "-q", "-B", "-f", str(POM), f"-P{spec.maven_profile}", f"-Dkafka.version={spec.version}",
           "dependency:copy-dependencies", f"-DoutputDirectory={lib}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not any(lib.glob(f"kafka_2.13-{spec.version}.jar")):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SandboxError(
            f"could not resolve Kafka {spec.version} from Maven Central (exit {proc.returncode}).\n{tail}\n"
            f"rerun: {' '.join(cmd)}"
        )
    marker.touch()
    return lib
