"""The gateway's HTTP protocol writes what one event-loop turn produced as one write: an answer's
head and body leave together, and a close never loses what was pending."""
import asyncio

from gateway.httpserver import _TurnWriter


class Recorder:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default


async def test_the_writes_of_one_turn_are_one_write_at_its_end():
    raw = Recorder()
    t = _TurnWriter(raw, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n")
    t.write(b"{}")
    assert raw.writes == []  # not before the turn ends
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}"]
    t.write(b"next")
    await asyncio.sleep(0)
    assert raw.writes[1:] == [b"next"]
    assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else is the transport's


async def test_a_close_writes_what_is_pending_first():
    raw = Recorder()
    t = _TurnWriter(raw, asyncio.get_running_loop())
    t.write(b"answer")
    t.close()
    assert raw.writes == [b"answer"] and raw.closed
    await asyncio.sleep(0)  # the turn's own flush finds nothing left
    assert raw.writes == [b"answer"]
