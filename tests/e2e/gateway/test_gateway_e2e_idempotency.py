"""Idempotency-Key through the gateway: replays are byte for byte, reuse is 422, duplicates racing
each other create one checkout and charge once (checked in the databases and the PSP's ledger)."""
import asyncio
import uuid

import asyncpg
import httpx

from cutylib.config import with_database


def state_of(checkout: dict) -> str:
    return checkout["state"].removeprefix("CHECKOUT_STATE_")


async def test_replay_is_byte_for_byte_and_reuse_is_422(http, auth, new_slots):
    a, b = await new_slots(2)
    me = auth("customer", Idempotency_Key=uuid.uuid4().hex)
    first = await http.post("/v1/checkouts", json={"slotId": a["id"]}, headers=me)
    assert first.status_code == 200, first.text
    again = await http.post("/v1/checkouts", content=b'{"slot_id": "%s"}' % a["id"].encode(), headers=me)
    assert again.status_code == 200 and again.content == first.content
    other = await http.post("/v1/checkouts", json={"slotId": b["id"]}, headers=me)
    assert other.status_code == 422, other.text
    assert other.json()["type"] == "idempotency-key-reused"
    missing = await http.post("/v1/checkouts", json={"slotId": b["id"]}, headers=auth("customer"))
    assert missing.status_code == 400 and missing.json()["type"] == "idempotency-key-required"


async def test_concurrent_duplicates_make_one_checkout_and_one_charge(stack, http, auth, new_slots, until_state):
    slot = (await new_slots(1))[0]
    sub = f"dup-{uuid.uuid4().hex[:8]}"
    me = auth("customer", sub=sub, Idempotency_Key=uuid.uuid4().hex)
    answers = await asyncio.gather(*(http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers=me) for _ in range(12)))
    ok = [r for r in answers if r.status_code == 200]
    assert ok, [r.text for r in answers]
    assert all(r.status_code == 409 and r.json()["type"] == "idempotency-key-in-flight" for r in answers if r.status_code != 200)
    assert len({r.content for r in ok}) == 1
    co = ok[0].json()

    dsn = stack.state()["database_url"]
    conn = await asyncpg.connect(with_database(dsn, "cuty_payments"))
    try:
        assert await conn.fetchval("SELECT count(*) FROM checkouts WHERE customer_id = $1", sub) == 1
    finally:
        await conn.close()
    conn = await asyncpg.connect(with_database(dsn, "cuty_booking"))
    try:
        held = await conn.fetchval("SELECT count(*) FROM holds WHERE slot_id = $1 AND status IN ('held', 'confirmed')",
                                   uuid.UUID(slot["id"]))
        assert held == 1
    finally:
        await conn.close()

    async with httpx.AsyncClient(base_url=stack.env["CUTY_PSP_URL"], timeout=10) as psp:
        charges_before = len((await psp.get("/v1/_ledger")).json()["charges"])
        pay = {**auth("customer", sub=sub), "Idempotency-Key": uuid.uuid4().hex}
        paid = await asyncio.gather(*(http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                                                headers=pay) for _ in range(8)))
        assert {r.status_code for r in paid} <= {200, 409}, [r.text for r in paid]
        assert len({r.content for r in paid if r.status_code == 200}) == 1
        assert state_of(await until_state(co["id"], pay)) == "COMPLETED"
        replay = await http.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"}, headers=pay)
        assert replay.content == next(r.content for r in paid if r.status_code == 200)
        assert len((await psp.get("/v1/_ledger")).json()["charges"]) == charges_before + 1
