"""cutylib.listen against a real PostgreSQL: one outage behaviour for every listener. A killed
listening backend is reported (`on_listening(False)`, the caller may have missed notifications),
the loop listens again on another connection and hears what follows; a `tick` runs on the listening
connection, and a tick that fails counts as a lost connection."""
import asyncio

from cutylib.listen import listen
from cutylib.testing.procs import wait_for

CHANNEL = "cuty_listen_test"


class Recorder:
    def __init__(self):
        self.payloads: list[str] = []
        self.states: list[bool] = []
        self.pids: list[int] = []

    def notified(self, payload: str) -> None:
        self.payloads.append(payload)

    def listening(self, up: bool) -> None:
        self.states.append(up)


async def _stop(task):
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_killed_listener_reports_the_gap_and_hears_the_next_notification(scratch_pool):
    r = Recorder()

    async def tick(conn):
        r.pids.append(conn.get_server_pid())

    task = asyncio.create_task(listen(scratch_pool, CHANNEL, r.notified, on_listening=r.listening, retry=0.05,
                             tick=tick, every=0.2))
    try:
        await wait_for(lambda: _true(r.states == [True]), timeout=5, message="listening")
        await scratch_pool.execute("SELECT pg_notify($1, 'one')", CHANNEL)
        await wait_for(lambda: _true(r.payloads == ["one"]), timeout=5, message="first notification")
        first = r.pids[0]
        assert await scratch_pool.fetchval("SELECT pg_terminate_backend($1)", first)
        await wait_for(lambda: _true(r.states[-2:] == [False, True] and r.pids[-1] != first), timeout=5,
                       message="listening again on another connection")
        await scratch_pool.execute("SELECT pg_notify($1, 'two')", CHANNEL)
        await wait_for(lambda: _true(r.payloads == ["one", "two"]), timeout=5, message="heard after the gap")
        assert len(set(r.pids)) == 2  # ticked on the listening connection, now and then
    finally:
        await _stop(task)
    assert r.states[-1] is False


async def test_a_failing_tick_counts_as_a_lost_connection(scratch_pool):
    r = Recorder()
    fail = {"next": False}

    async def tick(conn):
        if fail["next"]:
            fail["next"] = False
            raise OSError("as if the peer went away without a FIN")
        await conn.execute("SELECT 1")

    task = asyncio.create_task(listen(scratch_pool, CHANNEL, r.notified, on_listening=r.listening, retry=0.05,
                             tick=tick, every=0.1))
    try:
        await wait_for(lambda: _true(r.states == [True]), timeout=5, message="listening")
        fail["next"] = True
        await wait_for(lambda: _true(r.states[-2:] == [False, True] and len(r.states) >= 3), timeout=5,
                       message="listening again after the failed tick")
    finally:
        await _stop(task)


async def _true(value: bool) -> bool:
    return value
