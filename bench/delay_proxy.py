"""A pipelined TCP delay proxy for the link benchmark: every byte is forwarded ``one_way_ms`` after it was read, in
both directions, without waiting for earlier bytes to be acknowledged (a link's latency, not a request gate).

Used because this machine's kernel has no ``sch_netem`` (``tc qdisc ... netem``: "Specified qdisc kind is
unknown"); the link's *rate* is still a kernel qdisc (``tbf`` on the veth pair), so that leg keeps real TCP.
What the proxy hides: TCP windows and socket buffers see the short veth round trip, not the modelled one (the
proxy reads ahead as fast as the rate allows), so a small broker ``socket.send.buffer.bytes`` does not cap
throughput here the way it would on a real long link. Per direction the proxy holds at most ``max_buffer``
bytes in flight (then it stops reading: backpressure).

    python -m bench.delay_proxy --listen 127.0.0.1:39092 --to 10.77.0.2:39092 --one-way-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

CHUNK = 256 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, max_buffer: int) -> None:
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    state = {"bytes": 0, "eof": False}
    ready = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def read() -> None:
        try:
            while True:
                await room.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                queue.append((time.monotonic() + delay_s, data))
                state["bytes"] += len(data)
                if state["bytes"] >= max_buffer:
                    room.clear()
                ready.set()
        finally:
            state["eof"] = True
            ready.set()

    async def write() -> None:
        while True:
            if not queue:
                if state["eof"]:
                    break
                ready.clear()
                await ready.wait()
                continue
            due, data = queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            queue.popleft()
            writer.write(data)
            await writer.drain()
            state["bytes"] -= len(data)
            if state["bytes"] < max_buffer:
                room.set()
        if writer.can_write_eof():
            writer.write_eof()

    await asyncio.gather(read(), write())


async def _serve(listen: tuple[str, int], to: tuple[str, int], delay_s: float, max_buffer: int) -> None:
    async def handle(client_reader, client_writer):
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*to)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(_pump(client_reader, upstream_writer, delay_s, max_buffer),
                                 _pump(upstream_reader, client_writer, delay_s, max_buffer))
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (client_writer, upstream_writer):
                w.close()

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--to", type=_address, required=True)
    parser.add_argument("--one-way-ms", type=float, default=0.0)
    parser.add_argument("--max-buffer", type=int, default=64 << 20)
    args = parser.parse_args()
    asyncio.run(_serve(args.listen, args.to, args.one_way_ms / 1000, args.max_buffer))


if __name__ == "__main__":
    main()
