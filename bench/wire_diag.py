"""Run a Shoal CLI command with the fast path's channel calls counted, optionally under cProfile (a measurement
aid, not a test).

    python -m bench.wire_diag --out diag.json [--profile prof.out] -- copy --source ... --target ...

Counted, per process, by wrapping :mod:`mirror_core.kafka.wire_channel` from outside (the library itself is untouched):
``recv`` — kernel reads (``socket.recv_into``: the plain channel's, the TLS channel's ciphertext reads) with their
bytes; ``tls_read`` — ``TlsChannel.recv_into`` calls (each one or more ``SSLObject.read``); ``tls_want_read`` —
``SSLObject.read`` raising ``SSLWantReadError`` (no whole TLS record buffered); ``bio_write`` — ciphertext fed to the
incoming BIO; ``tls_records*`` — the TLS records in it, by size; ``tls_write`` — ``SSLObject.write`` calls;
``sendmsg`` — ``sendmsg`` calls; ``setsockopt`` — socket options set after connecting (the TLS channel's
``SO_RCVLOWAT`` changes); ``frames`` / ``frame_bytes`` / ``frames_over_64k`` — response frames received by the fast
connections (a Fetch answer is a large one). Also sampled every 0.25 s: the bytes received so far and each OS
thread's CPU seconds (to split the active phase's CPU by thread); at exit the process's getrusage (page faults,
context switches). The JSON is written at exit. ``--profile``: cProfile of the main (copying) thread, timed by that
thread's CPU clock.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import cProfile
import json
import os
import resource
import sys
import threading
import time

_COUNTS: collections.Counter = collections.Counter()


class _CountingSocket:
    """A socket proxy that counts ``recv_into`` and ``sendmsg`` (everything else passes through)."""

    def __init__(self, sock):
        self._sock = sock

    def recv_into(self, buffer, *args):
        n = self._sock.recv_into(buffer, *args)
        _COUNTS["recv"] += 1
        _COUNTS["recv_bytes"] += n
        return n

    def setsockopt(self, *args):
        _COUNTS["setsockopt"] += 1
        return self._sock.setsockopt(*args)

    def sendmsg(self, buffers, *args):
        _COUNTS["sendmsg"] += 1
        return self._sock.sendmsg(buffers, *args)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _CountingSSLObject:
    def __init__(self, obj):
        self._obj = obj

    def read(self, *args):
        _COUNTS["ssl_read"] += 1
        try:
            return self._obj.read(*args)
        except __import__("ssl").SSLWantReadError:
            _COUNTS["tls_want_read"] += 1
            raise

    def write(self, data):
        _COUNTS["tls_write"] += 1
        return self._obj.write(data)

    def __getattr__(self, name):
        return getattr(self._obj, name)


class _CountingBIO:
    def __init__(self, bio):
        self._bio = bio

    def write(self, data):
        _COUNTS["bio_write"] += 1
        _COUNTS["bio_write_bytes"] += memoryview(data).nbytes
        _count_records(data)
        return self._bio.write(data)

    def __getattr__(self, name):
        return getattr(self._bio, name)


def _count_records(data) -> None:
    """TLS records in ``data`` (whole records: what the channel hands the incoming BIO), by size."""
    view, pos = memoryview(data).cast("B"), 0
    while pos + 5 <= len(view):
        length = view[pos + 3] << 8 | view[pos + 4]
        _COUNTS["tls_records"] += 1
        _COUNTS["tls_records_" + (">16k" if length > 16384 else "4k-16k" if length >= 4096 else "<4k")] += 1
        pos += 5 + length


def install() -> None:
    from mirror_core.kafka import wire_channel
    plain_init, tls_init, tls_recv = (wire_channel.PlainChannel.__init__, wire_channel.TlsChannel.__init__,
                                      wire_channel.TlsChannel.recv_into)

    def plain(self, sock, *args, **kwargs):
        plain_init(self, sock, *args, **kwargs)
        self.sock = _CountingSocket(self.sock)
        if hasattr(self, "_lowat"):
            self._lowat.sock = self.sock

    def tls(self, sock, *args, **kwargs):
        tls_init(self, sock, *args, **kwargs)
        self.sock = _CountingSocket(self.sock)
        self._ssl = _CountingSSLObject(self._ssl)
        if hasattr(self, "_read"):
            self._read = self._ssl.read
        if hasattr(getattr(self, "_lowat", None), "sock"):
            self._lowat.sock = self.sock
        for name in ("_incoming", "_in"):
            if hasattr(self, name):
                setattr(self, name, _CountingBIO(getattr(self, name)))

    def recv(self, view, *args, **kwargs):
        _COUNTS["tls_read"] += 1
        n = tls_recv(self, view, *args, **kwargs)
        _COUNTS["tls_read_bytes"] += n
        return n

    from mirror_core.kafka import fast_connection
    receive_frame = fast_connection.FastConnection._receive_frame

    def frame(self, *args, **kwargs):
        out = receive_frame(self, *args, **kwargs)
        _COUNTS["frames"] += 1
        _COUNTS["frame_bytes"] += len(out)
        if len(out) > 65536:
            _COUNTS["frames_over_64k"] += 1
        return out

    fast_connection.FastConnection._receive_frame = frame
    send_all = wire_channel._sendmsg_all

    def sendmsg_all(sock, pending):   # the channel writes with os.writev first: count its calls here
        _COUNTS["sendmsg"] += 1
        return send_all(getattr(sock, "_sock", sock), pending)

    wire_channel._sendmsg_all = sendmsg_all
    wire_channel.PlainChannel.__init__, wire_channel.TlsChannel.__init__ = plain, tls
    wire_channel.TlsChannel.recv_into = recv


def _task_cpu() -> dict[str, list]:
    """Per OS thread of this process: [name, CPU seconds] (``/proc/self/task/*/stat``, user + system)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = [name, (int(fields[11]) + int(fields[12])) / tick]
    return out


def _sample(series: list, stop: threading.Event) -> None:
    """Every 0.25 s: (seconds since start, bytes received so far, per-thread CPU)."""
    start = time.monotonic()
    while not stop.wait(0.25):
        series.append((round(time.monotonic() - start, 2), _COUNTS["recv_bytes"], _task_cpu()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m bench.wire_diag", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--profile", help="also write cProfile stats here")
    args = parser.parse_args(argv[:split])
    install()
    profiler = cProfile.Profile(time.thread_time) if args.profile else None   # CPU of this (the copying) thread

    def dump() -> None:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        stop.set()
        with open(args.out, "w") as f:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            json.dump({"counts": dict(_COUNTS), "main_tid": str(threading.get_native_id()), "series": series,
                       "rusage": {"minflt": usage.ru_minflt, "majflt": usage.ru_majflt, "nvcsw": usage.ru_nvcsw,
                                  "nivcsw": usage.ru_nivcsw, "utime": usage.ru_utime, "stime": usage.ru_stime}}, f)

    series: list = []
    stop = threading.Event()
    threading.Thread(target=_sample, args=(series, stop), daemon=True, name="wire-diag").start()
    atexit.register(dump)
    from mirror_core.cli.main import main as cli
    if profiler is not None:
        profiler.enable()
    return cli(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
