"""Run a Shoal CLI command with the fast path's channel calls counted, optionally under cProfile (a measurement
aid, not a test).

    python -m bench.wire_diag --out diag.json [--profile prof.out] -- copy --source ... --target ...

Counted, per process, by wrapping :mod:`mirror_core.wire_channel` from outside (the library itself is untouched):
``recv`` — kernel reads (``socket.recv_into``: the plain channel's, the TLS channel's ciphertext reads) with their
bytes; ``tls_read`` — ``TlsChannel.recv_into`` calls (each one or more ``SSLObject.read``); ``tls_want_read`` —
``SSLObject.read`` raising ``SSLWantReadError`` (no whole TLS record buffered); ``bio_write`` — ciphertext fed to the
incoming BIO; ``tls_write`` — ``SSLObject.write`` calls; ``sendmsg`` — ``sendmsg`` calls. The JSON is written at
exit.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import cProfile
import json
import sys

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
        return self._bio.write(data)

    def __getattr__(self, name):
        return getattr(self._bio, name)


def install() -> None:
    from mirror_core import wire_channel

    plain_init, tls_init, tls_recv = (wire_channel.PlainChannel.__init__, wire_channel.TlsChannel.__init__,
                                      wire_channel.TlsChannel.recv_into)

    def plain(self, sock, *args, **kwargs):
        plain_init(self, sock, *args, **kwargs)
        self.sock = _CountingSocket(self.sock)

    def tls(self, sock, *args, **kwargs):
        tls_init(self, sock, *args, **kwargs)
        self.sock = _CountingSocket(self.sock)
        self._ssl = _CountingSSLObject(self._ssl)
        for name in ("_incoming", "_in"):
            if hasattr(self, name):
                setattr(self, name, _CountingBIO(getattr(self, name)))

    def recv(self, view, *args, **kwargs):
        _COUNTS["tls_read"] += 1
        n = tls_recv(self, view, *args, **kwargs)
        _COUNTS["tls_read_bytes"] += n
        return n

    wire_channel.PlainChannel.__init__, wire_channel.TlsChannel.__init__ = plain, tls
    wire_channel.TlsChannel.recv_into = recv


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m bench.wire_diag", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--profile", help="also write cProfile stats here")
    args = parser.parse_args(argv[:split])
    install()
    profiler = cProfile.Profile() if args.profile else None

    def dump() -> None:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        with open(args.out, "w") as f:
            json.dump(dict(_COUNTS), f, indent=1)

    atexit.register(dump)
    from mirror_core import cli

    if profiler is not None:
        profiler.enable()
    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
