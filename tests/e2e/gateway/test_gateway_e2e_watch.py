"""Live updates as Server-Sent Events, read through the real gateway by a real
HTTP client (httpx streaming) across a 3-D Secure purchase, with a reconnect by Last-Event-ID."""
from __future__ import annotations

import asyncio
import json

import httpx

from cutylib.testing.procs import wait_for
from tests.e2e.gateway.conftest import state_of


async def sse(resp: httpx.Response):
    """Each event of a text/event-stream response as {id, event, data}, comments skipped."""
    ev: dict = {}
    async for line in resp.aiter_lines():
        if not line:
            if ev:
                ev["data"] = json.loads(ev["data"])
                yield ev
                ev = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            ev[key] = value


async def read_until(events, stop) -> list[dict]:
    out = []
    async for ev in events:
        out.append(ev)
        if stop(ev):
            return out
    return out


def watch(http, checkout_id: str, headers: dict, last_event_id: str | None = None):
    h = dict(headers)
    if last_event_id is not None:
        h["Last-Event-ID"] = last_event_id
    return http.stream("GET", f"/v1/checkouts/{checkout_id}:watch", headers=h, timeout=30)


async def test_a_purchase_read_live_and_resumed_by_last_event_id(http, auth, fresh_key, new_slots, until_state):
    slot = (await new_slots(1))[0]
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    assert state_of(co) == "HELD"
    async with watch(http, co["id"], me) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = sse(resp)
        first = await anext(events)
        assert first["event"] == "state-changed" and state_of(first["data"]) == "HELD"
        assert first["data"]["id"] == co["id"]
        r = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_3ds"},
                            headers={**me, **fresh_key()})
        assert r.status_code == 200, r.text
        live = await asyncio.wait_for(read_until(events, lambda e: e["event"] == "payment-action-required"), 20)
    # The client went away here. The buyer completes 3-D Secure meanwhile.
    action = live[-1]["data"]
    assert state_of(action) == "AWAITING_ACTION"
    url = action["payment"]["nextAction"]["redirectUrl"]
    async with httpx.AsyncClient(timeout=10) as psp:
        assert (await psp.get(url)).status_code < 400
    await until_state(co["id"], me)
    seen = [first] + live
    async with watch(http, co["id"], me, last_event_id=seen[-1]["id"]) as resp:
        assert resp.status_code == 200
        resumed = await asyncio.wait_for(read_until(sse(resp), lambda e: False), 20)  # ends after COMPLETED
    assert resumed and state_of(resumed[-1]["data"]) == "COMPLETED"
    assert "nextAction" not in resumed[-1]["data"]["payment"] and resumed[-1]["data"]["payment"]["clientSecret"] == ""
    ids = [int(e["id"]) for e in seen + resumed]
    assert ids == sorted(set(ids)), ids  # no duplicate, in order
    # No gap: everything after the first event, replayed in one go, is exactly what the two streams sent.
    async with watch(http, co["id"], me, last_event_id=first["id"]) as resp:
        replay = await asyncio.wait_for(read_until(sse(resp), lambda e: False), 20)
    assert [(e["id"], e["event"]) for e in replay] == [(e["id"], e["event"]) for e in (live + resumed)]
    assert [state_of(e["data"]) for e in replay][-1] == "COMPLETED"


async def test_refusals_are_problems_before_the_stream(http, auth, fresh_key, new_slots):
    slot = (await new_slots(1))[0]
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    r = await http.get(f"/v1/checkouts/{co['id']}:watch", headers=auth("customer"))
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert (await http.get(f"/v1/checkouts/{co['id']}:watch")).status_code == 401
    bad = await http.get(f"/v1/checkouts/{co['id']}:watch", headers={**me, "Last-Event-ID": "x"})
    assert bad.status_code == 400 and bad.json()["field"] == "Last-Event-ID"


async def test_the_per_user_cap_and_a_closed_client_frees_its_stream(http, auth, fresh_key, new_slots):
    slot = (await new_slots(1))[0]
    me = auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30) as c:
        streams, readers = [], []  # (a reader dropped closes its response: keep them)
        for _ in range(5):  # CUTY_MAX_WATCH_STREAMS_PER_USER's default
            cm = watch(c, co["id"], me)
            resp = await cm.__aenter__()
            assert resp.status_code == 200
            readers.append(sse(resp))
            await anext(readers[-1])
            streams.append(cm)
        # The cap holds across the payments replicas (a leased place per stream in the database).
        async with watch(c, co["id"], me) as over:
            assert over.status_code == 409, over.status_code
            assert over.headers["content-type"] == "application/problem+json"
            assert json.loads(await over.aread())["type"] == "too-many-watch-streams"
        await streams.pop().__aexit__(None, None, None)  # the client goes away: the gateway cancels the call

        async def admitted() -> bool:
            async with watch(c, co["id"], me) as resp:
                return resp.status_code == 200
        await wait_for(admitted, timeout=5, interval=0.1, message="a closed stream's place to be freed")
        for cm in streams:
            await cm.__aexit__(None, None, None)


async def test_a_stream_ends_when_the_token_that_opened_it_expires(http, auth, fresh_key, new_slots):
    """A watch lives no longer than its token would be accepted (its `exp` plus the gateway's 30 s
    leeway): then one `event: error` saying the token expired, and the stream ends; the client
    reconnects with a fresh token and Last-Event-ID."""
    from tests.e2e.gateway.conftest import make_token
    slot = (await new_slots(1))[0]
    sub = "watcher-" + fresh_key()["Idempotency-Key"][:8]
    me = {"Authorization": f"Bearer {make_token('customer', sub)}"}
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**me, **fresh_key()})).json()
    short = {"Authorization": f"Bearer {make_token('customer', sub, ttl=-27)}"}  # accepted for ~3 s more
    async with watch(http, co["id"], short) as resp:
        assert resp.status_code == 200
        events = await asyncio.wait_for(read_until(sse(resp), lambda e: False), 15)
    assert events[0]["event"] == "state-changed"
    assert events[-1]["event"] == "error" and events[-1]["data"]["type"] == "token-expired", events[-1]
    assert events[-1]["data"]["status"] == 401
    # a fresh token resumes where it stopped
    async with watch(http, co["id"], me, last_event_id=events[0]["id"]) as resp:
        assert resp.status_code == 200
