"""Webhook delivery guarantees: signatures, retries until 2xx, unreachable receivers, shutdown."""

import time

import httpx

from pspsim import signing
from pspsim.server import BackgroundServer

from cutylib.testing.procs import free_port
from pspsim_harness import RECEIVER_SECRET, Receiver, Sim, SimProcess, wait_for


async def test_receiver_500_is_retried_until_2xx(sim, receiver, new_key):
    intent = (await sim.create(new_key(), metadata={"receiver_fail_first": "3"})).json()
    await wait_for(lambda: receiver.for_intent(intent["id"]), what="acknowledged delivery")
    attempts = receiver.for_intent(intent["id"], acked_only=False)
    assert [d.status for d in attempts] == [500, 500, 500, 200]
    assert len({d.event["id"] for d in attempts}) == 1  # a retry keeps the event id
    assert len({d.body for d in attempts}) == 1  # and the body
    assert all(d.signature_ok for d in attempts)

    async def acknowledged():
        # The simulator records the answer after the receiver has sent it: wait for its books.
        return [e for e in await sim.events() if e["object_id"] == intent["id"] and e["acknowledged"]]

    [stats] = await wait_for(acknowledged, what="the simulator to record the acknowledgement")
    assert (stats["attempts"], stats["acknowledged"], stats["last_status"]) == (4, 1, 200)


async def test_real_signature_header(sim, receiver, new_key):
    intent = (await sim.create(new_key())).json()
    [d] = await wait_for(lambda: receiver.for_intent(intent["id"]))
    t, v1s = signing.parse(d.signature)
    assert len(v1s) == 2  # signed with the old and the new secret
    assert abs(time.time() - t) < 60
    assert signing.verify(d.signature, d.body, [RECEIVER_SECRET])
    assert signing.verify(d.signature, d.body, ["whsec_it_old"])
    assert not signing.verify(d.signature, d.body, ["whsec_wrong"])
    assert not signing.verify(d.signature, d.body + b" ", [RECEIVER_SECRET])
    assert not signing.verify(d.signature, d.body, [RECEIVER_SECRET], now=t + 301)  # replayed later
    assert not signing.verify(d.signature, d.body, [RECEIVER_SECRET], now=t - 301)  # from the future


async def test_unreachable_receiver_is_retried_until_it_comes_up(tmp_path):
    port = free_port()
    proc = SimProcess(tmp_path / "pspsim.log", CUTY_PSP_WEBHOOK_URL=f"http://127.0.0.1:{port}/webhooks")
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            sim = Sim(proc.url, client)
            intent = (await sim.create("unreachable-1")).json()

            async def failed_twice():
                return [e for e in await sim.events() if e["object_id"] == intent["id"] and e["attempts"] >= 2]

            [stats] = await wait_for(failed_twice, what="two failed attempts")
            assert stats["acknowledged"] == 0 and stats["last_status"] is None

            receiver = Receiver()
            with BackgroundServer.for_app(receiver.app, port=port):
                [d] = await wait_for(lambda: receiver.for_intent(intent["id"]), what="delivery once up")
                assert d.event["id"] == stats["id"] and d.signature_ok
            assert await sim.charges_for("unreachable-1") == 1
    finally:
        code = proc.terminate()
    assert code == 0  # SIGTERM: graceful exit, pending work dropped
    assert any(line.get("msg") == "stopped" for line in proc.log_lines())
