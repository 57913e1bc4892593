"""A merchant's webhook endpoint that attacks whoever POSTs to it: a plain asyncio HTTP/1.1 server
(no framework, so nothing between the test and the bytes on the wire). The path says how it
answers, `/<mode>/<status>`:

- `bomb`: a gzip body of `inflated` zero bytes (1 GiB by default) with `Content-Encoding: gzip`
  and its Content-Length: about a thousandth of that on the wire, generated as it is sent (never
  held: a few MiB at the most on this side);
- `endless`: a chunked body that never ends, as fast as the socket takes it;
- `trickle`: a chunked body of one byte every `trickle_seconds`, forever;
- `hang`: no answer at all; the connection stays open until the caller closes it.

It counts the requests and the bytes it managed to send (the caller's reading decides that)."""
from __future__ import annotations

import asyncio
import contextlib
import zlib

GIB = 1 << 30
_BLOCK = 1 << 20  # the bomb is this many zero bytes, deflated once and repeated
_FINAL_EMPTY_BLOCK = b"\x03\x00"  # an empty, final, fixed-Huffman deflate block (byte-aligned before it)


class GzipBomb:
    """A valid gzip stream of `inflated` zero bytes (a multiple of 1 MiB), as chunks.

    Deflate after a full flush starts from an empty dictionary at a byte boundary, so the
    compressed form of one more MiB of zeros is the same bytes every time: the stream is that
    chunk repeated, then a final empty block and the gzip trailer (CRC-32 and size, computed here
    one MiB at a time)."""

    def __init__(self, inflated: int = GIB):
        if inflated <= 0 or inflated % _BLOCK:
            raise ValueError(f"inflated must be a positive multiple of {_BLOCK}, got {inflated}")
        self.blocks = inflated // _BLOCK
        self.inflated = inflated
        zeros = bytes(_BLOCK)
        co = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        self.first = co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH)  # the gzip header with it
        self.again = co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH)
        assert co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH) == self.again
        crc = 0
        for _ in range(self.blocks):
            crc = zlib.crc32(zeros, crc)
        self.trailer = _FINAL_EMPTY_BLOCK + crc.to_bytes(4, "little") + (inflated % (1 << 32)).to_bytes(4, "little")

    @property
    def size(self) -> int:
        return len(self.first) + (self.blocks - 1) * len(self.again) + len(self.trailer)

    def chunks(self, per_chunk: int = 64):
        """The stream, `per_chunk` MiB of inflated data per chunk."""
        yield self.first
        left = self.blocks - 1
        while left > 0:
            n = min(per_chunk, left)
            yield self.again * n
            left -= n
        yield self.trailer


class HostileEndpoint:
    def __init__(self, *, inflated: int = GIB, trickle_seconds: float = 0.2):
        self.bomb = GzipBomb(inflated)
        self.trickle_seconds = trickle_seconds
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, headers in lower case) as POSTed
        self.sent: dict[str, int] = {}  # path -> body bytes written
        self.hanging = 0  # requests of mode `hang` whose caller is still connected
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    def url(self, mode: str, status: int = 200) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/{status}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._handlers.add(asyncio.current_task())
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                while True:  # keep-alive: one request after the other
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                    first, *lines = head.strip().split("\r\n")
                    _, path, _ = first.split(" ", 2)
                    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
                    await reader.readexactly(int(headers.get("content-length", "0")))
                    self.requests.append((path, headers))
                    self.sent.setdefault(path, 0)
                    _, mode, status = path.split("/")
                    await self._answer(reader, writer, path, mode, int(status))
        finally:
            writer.close()
            self._handlers.discard(asyncio.current_task())

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, mode: str,
                      status: int) -> None:
        async def send(data: bytes) -> None:
            writer.write(data)
            await writer.drain()
            self.sent[path] += len(data)

        if mode == "hang":
            self.hanging += 1
            try:
                while await reader.read(1 << 16):  # until the caller gives up and closes
                    pass
            finally:
                self.hanging -= 1
            raise ConnectionError("the caller closed")
        head = f"HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\n"
        if mode == "bomb":
            writer.write(f"{head}Content-Encoding: gzip\r\nContent-Length: {self.bomb.size}\r\n\r\n".encode())
            for chunk in self.bomb.chunks():
                await send(chunk)
            return
        writer.write(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
        if mode == "endless":
            block = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
            while True:
                await send(block)
        elif mode == "trickle":
            while True:
                await send(b"1\r\nx\r\n")
                await asyncio.sleep(self.trickle_seconds)
        raise ValueError(f"unknown mode {mode!r}")

    async def __aenter__(self) -> "HostileEndpoint":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)


def rss_bytes() -> int:
    """This process's resident set now (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class RssPeak:
    """The highest VmRSS seen while the block runs, sampled every `interval` seconds by a thread
    (which samples even while the event loop is busy inflating something)."""

    def __init__(self, interval: float = 0.002):
        import threading

        self.interval = interval
        self.before = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        return self.peak - self.before

    def __enter__(self) -> "RssPeak":
        self.before = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
