"""Starts, checks and stops one sandbox broker: a KRaft JVM process on loopback.

State per cluster lives in ``<sandbox>/<name>/``: ``server.properties``, ``data/``, ``logs/server.log`` (the broker's
log), ``logs/console.log`` (JVM stdout/stderr), ``broker.pid`` and ``cluster.json`` (what clients need: bootstrap
addresses and, for a secure cluster, the CA path and SCRAM users — secrets stay in these files only).

Invariant: a pid file names a process only while that process's command line contains this cluster's
``server.properties`` path; anything else is a stale file and is ignored, so ``down`` never kills a stranger.

Open files: a broker holds a descriptor per log segment (thousands with thousands of partitions) and per client
connection, so the launched JVM gets its soft open-file limit raised to the hard limit (:func:`broker_open_files`;
HotSpot on Linux does the same by itself unless ``-XX:-MaxFDLimit``: done here so it does not depend on the JVM),
and the limit is written to ``console.log`` and shown by ``shoal sandbox up`` / ``status``.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from base64 import urlsafe_b64encode
from dataclasses import dataclass
from pathlib import Path

from mirror_core.dev.sandbox import jars, tls
from mirror_core.dev.sandbox.spec import SCRAM_MECHANISM, ClusterSpec, render_server_properties
from mirror_core.errors import SandboxError

LOG_CONFIG = {"kafka4": Path(__file__).with_name("log4j2.properties"),
              "kafka3": Path(__file__).with_name("log4j.properties")}
SCRAM_USERS = ("shoal", "alice")


@dataclass(frozen=True)
class BrokerStatus:
    name: str
    version: str
    running: bool
    pid: int | None
    bootstrap: str
    secure_bootstrap: str | None
    log_file: Path
    cluster_id: str | None
    open_files: int | None = None  # the running broker's soft RLIMIT_NOFILE (None: not running, or unknown)


class SandboxBroker:
    """One named cluster of the sandbox and the files that describe it."""

    def __init__(self, spec: ClusterSpec, sandbox_dir: Path, cache_dir: Path):
        self.spec = spec
        self.home = sandbox_dir / spec.name
        self.cache_dir = cache_dir
        self.data_dir = self.home / "data"
        self.log_dir = self.home / "logs"
        self.properties = self.home / "server.properties"
        self.pid_file = self.home / "broker.pid"
        self.info_file = self.home / "cluster.json"
        self._proc: subprocess.Popen | None = None  # set when this object launched the JVM itself

    # ---- observation -------------------------------------------------------------------------------------------
    def pid(self) -> int | None:
        """The broker's pid if it is alive and really ours (see module invariant)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        return pid if str(self.properties).encode() in cmdline else None

    def status(self) -> BrokerStatus:
        pid = self.pid()
        return BrokerStatus(self.spec.name, self.spec.version, pid is not None, pid, self.spec.bootstrap,
                            self.spec.secure_bootstrap, self.log_dir / "server.log", self._cluster_id(),
                            process_open_files(pid) if pid is not None else None)

    def info(self) -> dict:
        """What clients need to reach this cluster (bootstrap, CA, SCRAM users); written by :meth:`start`."""
        if not self.info_file.exists():
            raise SandboxError(f"sandbox cluster {self.spec.name!r} was never started; run `shoal sandbox up`")
        return json.loads(self.info_file.read_text())

    def answers(self, timeout: float = 2.0) -> bool:
        """True when the broker answers a Metadata request on its PLAINTEXT listener."""
        from confluent_kafka.admin import AdminClient

        try:
            admin = AdminClient({"bootstrap.servers": self.spec.bootstrap, "log_level": 0,
                                 "socket.connection.setup.timeout.ms": int(timeout * 1000)})
            md = admin.list_topics(timeout=timeout)
            return bool(md.brokers)
        except Exception:  # noqa: BLE001 - any failure means "not answering yet"
            return False

    def log_tail(self, lines: int = 40) -> str:
        chunks = []
        for f in (self.log_dir / "server.log", self.log_dir / "console.log"):
            if f.exists():
                text = f.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- {f} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(chunks) or f"(no log files in {self.log_dir})"

    # ---- lifecycle ---------------------------------------------------------------------------------------------
    def resolve(self) -> Path:
        """The broker's classpath directory, downloading the jars from Maven Central on first use."""
        return jars.resolve_classpath(self.spec, self.cache_dir)

    def start(self, *, timeout: float = 90.0) -> BrokerStatus:
        """Start the broker unless it already runs and answers; wait until it answers Metadata."""
        if self.pid() is not None:
            if self._wait_until_answering(min(timeout, 30.0)):
                return self.status()
            raise SandboxError(self._failure(f"is running (pid {self.pid()}) but does not answer Metadata"))
        self._check_ports_free()
        lib = self.resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        tls_meta = tls.ensure_tls_material(self.home / "tls", self.spec.tls_names) if self.spec.secure_port else None
        users = self._users() if self.spec.secure_port else None
        self.properties.write_text(self._render_properties(tls_meta, users))
        self.properties.chmod(0o600)
        if not (self.data_dir / "meta.properties").exists():
            self._format(lib)
        self._launch(lib)
        if not self._wait_until_answering(timeout):
            pid = self.pid()
            if pid is not None:
                self._terminate(pid)
            raise SandboxError(self._failure(f"did not answer Metadata within {timeout:.0f}s"))
        self._write_info(tls_meta, users)
        return self.status()

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout``). True if a process was stopped."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        self._terminate(pid, timeout)
        self.pid_file.unlink(missing_ok=True)
        return True

    def wipe(self) -> None:
        """Stop and delete every file of this cluster (data, logs, TLS material)."""
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)

    # ---- internals ---------------------------------------------------------------------------------------------
    def _java_cmd(self, lib: Path, main: str, *args: str) -> list[str]:
        log_cfg = LOG_CONFIG[self.spec.maven_profile]
        log_prop = ("-Dlog4j2.configurationFile=" if self.spec.major >= 4 else "-Dlog4j.configuration=file:")
        java = shutil.which("java") or "java"
        return [java, *self.spec.heap.split(), "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dkafka.logs.dir={self.log_dir}", f"{log_prop}{log_cfg}",
                "-cp", f"{lib}/*", main, *args]

    def _render_properties(self, tls_meta: dict | None, users: dict[str, str] | None = None) -> str:
        return render_server_properties(self.spec, data_dir=str(self.data_dir), tls=tls_meta, users=users)

    def _new_cluster_id(self) -> str:
        """The id a first start formats the storage with (the nodes of one multi-node cluster share theirs)."""
        return new_cluster_id()

    def _format(self, lib: Path) -> None:
        cluster_id = self._new_cluster_id()
        cmd = self._java_cmd(lib, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                             "-c", str(self.properties), "--ignore-formatted")
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.home)
        if proc.returncode != 0:
            raise SandboxError(self._failure(f"storage format failed (exit {proc.returncode}):\n"
                                             f"{proc.stdout}{proc.stderr}", cmd=cmd))

    def _launch(self, lib: Path) -> None:
        cmd = self._java_cmd(lib, self.spec.main_class, str(self.properties))
        with open(self.log_dir / "console.log", "ab") as console:
            self._proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=self.home, start_new_session=True)
            # raised on the child itself (prlimit), not in a preexec_fn: brokers are started from several threads
            # at once (Sandbox.up), where a preexec_fn is unsafe; the limit applies to every later open() anyway
            console.write(f"shoal sandbox: {raise_open_files(self._proc.pid)}\n".encode())
        self.pid_file.write_text(str(self._proc.pid))

    def _wait_until_answering(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Our own child is judged by its exit status: right after launch the java launcher may still be
            # exec'ing, and /proc/<pid>/cmdline does not yet name server.properties.
            exited = self._proc.poll() is not None if self._proc is not None else self.pid() is None
            if exited:
                return False
            if self.answers():
                return True
            time.sleep(0.5)
        return False

    def _check_ports_free(self) -> None:
        for port in self.spec.ports():
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    raise SandboxError(
                        f"sandbox cluster {self.spec.name!r} needs port {port}, which another process holds "
                        f"(find it with `ss -ltnp 'sport = :{port}'`); stop it and rerun `shoal sandbox up`"
                    ) from None

    def _write_info(self, tls_meta: dict | None, users: dict[str, str] | None) -> None:
        info: dict = {"name": self.spec.name, "version": self.spec.version, "bootstrap": self.spec.bootstrap,
                      "cluster_id": self._cluster_id()}
        if tls_meta is not None and users is not None:
            self._ensure_scram_users(users)
            info["secure"] = {"bootstrap": self.spec.secure_bootstrap, "security.protocol": "SASL_SSL",
                              "sasl.mechanism": SCRAM_MECHANISM, "ssl.ca.location": tls_meta["ca"],
                              "users": users}
        self.info_file.write_text(json.dumps(info, indent=2))
        self.info_file.chmod(0o600)

    def _users(self) -> dict[str, str]:
        """The secure listener's users and their random passwords: those of an earlier start (kept in
        ``cluster.json``, private to the user), else new ones. Known before the broker starts, since the PLAIN
        mechanism reads them from ``server.properties`` (also 0600)."""
        old = json.loads(self.info_file.read_text()).get("secure", {}).get("users") if self.info_file.exists() \
            else None
        return old or {name: secrets.token_urlsafe(18) for name in SCRAM_USERS}

    def _ensure_scram_users(self, users: dict[str, str]) -> None:
        """SCRAM-SHA-256 and SCRAM-SHA-512 credentials for ``users``, created through the Admin API (no secret on
        a command line)."""
        from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        admin = AdminClient({"bootstrap.servers": self.spec.bootstrap, "log_level": 0})
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):  # one per request (broker)
            upserts = [UserScramCredentialUpsertion(name, ScramCredentialInfo(mechanism, 4096), password.encode())
                       for name, password in users.items()]
            for name, fut in admin.alter_user_scram_credentials(upserts).items():
                try:
                    fut.result(timeout=30)
                except Exception as exc:  # noqa: BLE001
                    raise SandboxError(f"could not create {mechanism.name} user {name!r} on {self.spec.name!r}: "
                                       f"{exc}") from exc

    def _cluster_id(self) -> str | None:
        meta = self.data_dir / "meta.properties"
        if not meta.exists():
            return None
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1]
        return None

    def _terminate(self, pid: int, timeout: float = 30.0) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    return
            elif not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
                return
            time.sleep(0.2)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return

    def _failure(self, what: str, cmd: list[str] | None = None) -> str:
        rerun = " ".join(cmd) if cmd else f"shoal sandbox up {self.spec.name}"
        return (f"sandbox cluster {self.spec.name!r} (Kafka {self.spec.version}) {what}\n"
                f"{self.log_tail()}\nlogs: {self.log_dir}\nrerun: {rerun}")


NOFILE_WHEN_UNLIMITED = 1 << 20  # Linux's default fs.nr_open: the most a soft limit may be when the hard one is none


def broker_open_files(soft: int, hard: int) -> int:
    """The soft open-file limit (RLIMIT_NOFILE) a broker JVM gets: the hard limit; when there is none (RLIM_INFINITY,
    which no soft NOFILE limit may be) 2**20, or the current soft limit if that is higher. Pure."""
    if hard != resource.RLIM_INFINITY:
        return hard
    return max(soft, NOFILE_WHEN_UNLIMITED)


def raise_open_files(pid: int) -> str:
    """Raise process ``pid``'s soft open-file limit (:func:`broker_open_files`); returns a sentence saying what
    limit it got (or why it kept its own)."""
    try:
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        wanted = broker_open_files(soft, hard)
        if wanted != soft:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError, AttributeError) as exc:  # not Linux, the child already gone, or not permitted
        return f"open-file limit of the broker not raised ({type(exc).__name__}: {exc})"
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return f"open-file limit of the broker (pid {pid}): {wanted} (was {soft}, hard limit {shown})"


def process_open_files(pid: int) -> int | None:
    """A running process's soft open-file limit, from ``/proc/<pid>/limits`` (None when it cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                value = line.split()[3]
                return None if value == "unlimited" else int(value)
    except (OSError, IndexError, ValueError):
        return None
    return None


def new_cluster_id(random_bytes=lambda: uuid.uuid4().bytes) -> str:
    """A random cluster id as Kafka writes one (URL-safe base64 of 16 bytes), never starting with ``-``: Kafka's
    ``Uuid.randomUuid`` draws again for those too, because ``kafka-storage format -t -xyz…`` reads the id as an
    option and fails (one start in 64 did, before)."""
    while True:
        cluster_id = urlsafe_b64encode(random_bytes()).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True
