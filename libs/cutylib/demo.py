"""Demo data for `make run`, and `make demo` against the running stack, all through the gateway:

1. 50 buyers race for one slot: one wins, every loser is told at once and offered alternatives
   (the first one held for them for 60 s); the winner pays and the booking completes.
1d. A salon's real day: a service performed by two stylists inside their working hours; the free
   times of the week; three customers check out the same time with any free stylist, the third
   loses it, keeps the nearest other time held for them, and takes it with one call.
2. A customer buys a code: create, pay, completed, the code shown to its buyer.
3. The timeline of that payment, as support would read it.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pathlib
import secrets
import sys
import time
import uuid
from zoneinfo import ZoneInfo

import httpx
import jwt

from .tenancy import MERCHANT_ROLES

ZONE = "Europe/Istanbul"
SLOT_HOURS = range(9, 18)  # 09:00 .. 17:00 local starts, one hour each
DAYS = 7
PRICE = {"currencyCode": "TRY", "amountMinor": "75000"}
CODES = 200
TOKEN_TTL = 7 * 24 * 3600
# Two merchants: a salon chain that owns the demo salon, and a shop that owns the gift
# cards. Each has its own staff and admin tokens; customers and the operator belong to none.
SALON_MERCHANT = "demo-salons"
SHOP_MERCHANT = "demo-shop"
MERCHANTS = (SALON_MERCHANT, SHOP_MERCHANT)


def token(secret: str, sub: str, role: str, ttl: float = TOKEN_TTL, org: str = "") -> str:
    now = int(time.time())
    claims = {"sub": sub, "role": role, "iat": now, "exp": now + int(ttl)}
    if org:
        claims["org"] = org
    return jwt.encode(claims, secret, algorithm="HS256")


def demo_tokens(secret: str) -> dict[str, str]:
    """A token per role, and per merchant for the merchants' roles ("admin@demo-shop")."""
    tokens = {role: token(secret, f"demo-{role}", role) for role in ("customer", "operator")}
    for merchant in MERCHANTS:
        for role in ("staff", "admin"):
            tokens[f"{role}@{merchant}"] = token(secret, f"demo-{role}-{merchant}", role, org=merchant)
    return tokens


def _auth(secret: str, sub: str, role: str, *, merchant: str = "", **extra: str) -> dict[str, str]:
    assert (role in MERCHANT_ROLES) == bool(merchant), "staff and admins belong to a merchant, nobody else does"
    return {"Authorization": f"Bearer {token(secret, sub, role, 600, org=merchant)}", **extra}


def _admin(secret: str, merchant: str) -> dict[str, str]:
    return _auth(secret, f"demo-admin-{merchant}", "admin", merchant=merchant)


def _ok(r: httpx.Response) -> dict:
    if r.status_code != 200:
        raise RuntimeError(f"{r.request.method} {r.request.url.path} -> {r.status_code}: {r.text[:500]}")
    return r.json()


def week_of_slots(resource_id: str, today: dt.date) -> list[dict]:
    zone = ZoneInfo(ZONE)
    out = []
    for d in range(1, DAYS + 1):
        day = today + dt.timedelta(days=d)
        for h in SLOT_HOURS:
            start = dt.datetime(day.year, day.month, day.day, h, tzinfo=zone)
            out.append({"resourceId": resource_id, "startTime": start.isoformat(),
                        "endTime": (start + dt.timedelta(hours=1)).isoformat(), "price": PRICE})
    return out


def _window(days: int = DAYS + 1) -> dict[str, str]:
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return {"startTime": now.isoformat(), "endTime": (now + dt.timedelta(days=days)).isoformat()}


def ensure_demo_data(base_url: str, secret: str, data_dir: pathlib.Path, say=print) -> dict:
    """Create the demo salon and product once; on later starts check that they still exist.
    The ids are kept in CUTY_DATA_DIR/demo.json, so a second `make run` adds nothing."""
    marker = pathlib.Path(data_dir) / "demo.json"
    salons, shop = _admin(secret, SALON_MERCHANT), _admin(secret, SHOP_MERCHANT)
    with httpx.Client(base_url=base_url, timeout=30) as c:
        if marker.exists():
            demo = json.loads(marker.read_text())
            salon = c.get(f"/v1/salons/{demo['salon_id']}/slots", params=_window(), headers=salons)
            stock = c.get(f"/v1/products/{demo['product_id']}/stock", headers=shop)
            if salon.status_code == 200 and stock.status_code == 200:
                say(f"demo data present (salon {demo['salon_id']}, product {demo['product_id']})")
                return demo
            if 404 not in (salon.status_code, stock.status_code):
                raise RuntimeError(f"cannot check the demo data: {salon.status_code} {stock.status_code}")
            say("demo data missing from the database (new database?); creating it again")
        say(f"creating demo data: merchant {SALON_MERCHANT}'s salon in Europe/Istanbul, two stylists, a week of "
            f"slots; merchant {SHOP_MERCHANT}'s product with codes")
        salon = _ok(c.post("/v1/salons", json={"name": "Cuty Demo Salon", "timeZone": ZONE}, headers=salons))
        today = dt.datetime.now(ZoneInfo(ZONE)).date()
        resources, slots = [], 0
        for name in ("Ayşe (stylist)", "Mehmet (stylist)"):
            res = _ok(c.post(f"/v1/salons/{salon['id']}/resources", json={"name": name}, headers=salons))
            resources.append(res["id"])
            made = _ok(c.post(f"/v1/salons/{salon['id']}/slots:batchCreate", json={"slots": week_of_slots(res["id"], today)},
                              headers=salons))
            slots += len(made.get("slots", []))
        product = _ok(c.post("/v1/products", json={"sku": f"DEMO-GIFT-100-{secrets.token_hex(3).upper()}",
                                                   "name": "Gift card 100 TRY",
                                                   "price": {"currencyCode": "TRY", "amountMinor": "10000"}},
                                 headers=shop))
        codes = [f"GIFT-{secrets.token_hex(2).upper()}-{secrets.token_hex(2).upper()}-{secrets.token_hex(2).upper()}"
                 for _ in range(CODES)]
        imported = _ok(c.post(f"/v1/products/{product['id']}/codes:import", json={"batchRef": "demo-1", "codes": codes},
                              headers=shop))
    demo = {"salon_id": salon["id"], "resource_ids": resources, "slots": slots, "product_id": product["id"],
            "codes": int(imported.get("imported", 0)), "salon_merchant": SALON_MERCHANT, "shop_merchant": SHOP_MERCHANT}
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(demo, indent=2))
    return demo


# `make demo` ----------------------------------------------------------------------------------------

async def _until_terminal(c: httpx.AsyncClient, checkout_id: str, headers: dict, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        co = _ok(await c.get(f"/v1/checkouts/{checkout_id}", headers=headers))
        if co["state"].removeprefix("CHECKOUT_STATE_") in ("COMPLETED", "FAILED", "REFUNDED", "EXPIRED", "CANCELLED",
                                                           "REJECTED", "CANCELLED_AFTER_PURCHASE"):
            return co
        if time.monotonic() > deadline:
            raise TimeoutError(f"checkout {checkout_id} still {co['state']} after {timeout:g} s")
        await asyncio.sleep(0.2)


def _appointment(at: dt.time) -> dt.datetime:
    """The race's and the reschedule's appointments: the day after tomorrow, so that whatever the
    hour of the run they start more than the salon's free-cancellation hours (24) ahead, and the
    winner may still reschedule and cancel for free (tomorrow's 10:00 was inside them after 07:00 UTC)."""
    return dt.datetime.combine(dt.datetime.now(ZoneInfo(ZONE)).date() + dt.timedelta(days=2), at, ZoneInfo(ZONE))


async def race(c: httpx.AsyncClient, secret: str, demo: dict, buyers: int = 50) -> tuple[dict, dict] | None:
    """The race for one slot; the winner's (headers, completed checkout), None when nobody won."""
    admin = _admin(secret, SALON_MERCHANT)
    run = uuid.uuid4().hex[:6]
    # A chair of its own per run, so reruns never collide with an earlier race's booking.
    res = _ok(await c.post(f"/v1/salons/{demo['salon_id']}/resources", json={"name": f"Race chair {run}"}, headers=admin))
    start = _appointment(dt.time(10))
    slot = _ok(await c.post(f"/v1/salons/{demo['salon_id']}/slots:batchCreate", headers=admin, json={"slots": [
        {"resourceId": res["id"], "startTime": start.isoformat(), "endTime": (start + dt.timedelta(hours=1)).isoformat(),
         "price": PRICE}]}))["slots"][0]
    print(f"\n1) {buyers} buyers race for slot {slot['id']} ({slot.get('localStartTime', start.isoformat())})")
    heads = [_auth(secret, f"buyer-{run}-{i}", "customer", **{"Idempotency-Key": uuid.uuid4().hex}) for i in range(buyers)]
    t0 = time.perf_counter()
    answers = await asyncio.gather(*(c.post("/v1/checkouts", json={"slotId": slot["id"]}, headers=h) for h in heads))
    ms = (time.perf_counter() - t0) * 1000
    won = [(h, r.json()) for h, r in zip(heads, answers) if r.status_code == 200]
    lost = [r.json() for r in answers if r.status_code != 200]
    kinds = ", ".join(sorted({f"{p.get('status')} {p.get('type')}" for p in lost}))
    print(f"   all {buyers} answered in {ms:.0f} ms: {len(won)} winner, {len(lost)} told at once ({kinds})")
    alts = {a["id"]: a for p in lost for a in p.get("alternatives", [])}
    for a in alts.values():
        print(f"   alternative offered: slot {a['id']} at {a.get('localStartTime')} (stylist {a.get('resourceId')})")
    kept = [p["heldAlternative"] for p in lost if p.get("heldAlternative")]
    print(f"   {len(kept)} of the {len(lost)} losers keep an alternative held for them for 60 s (the rest were "
          f"told the free ones: there are fewer free slots nearby than losers)")
    if not won:
        return None
    head, co = won[0]
    print(f"   winner: checkout {co['id']} {co['state']} until {co.get('expireTime')}, amount {co.get('amount')}")
    pay = {**head, "Idempotency-Key": uuid.uuid4().hex}
    _ok(await c.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"}, headers=pay))
    done = await _until_terminal(c, co["id"], head)
    print(f"   winner paid: checkout {done['state']}")
    return head, done


async def reschedule(c: httpx.AsyncClient, secret: str, demo: dict, head: dict, done: dict) -> dict:
    """The winner moves the booking to a dearer slot of the same salon an hour
    later; the difference is charged with the card of the purchase, then the old slot is released."""
    admin = _admin(secret, SALON_MERCHANT)
    run = uuid.uuid4().hex[:6]
    res = _ok(await c.post(f"/v1/salons/{demo['salon_id']}/resources", json={"name": f"Reschedule chair {run}"},
                           headers=admin))
    start = _appointment(dt.time(11))
    dearer = {"currencyCode": PRICE["currencyCode"], "amountMinor": str(int(PRICE["amountMinor"]) + 2500)}
    slot = _ok(await c.post(f"/v1/salons/{demo['salon_id']}/slots:batchCreate", headers=admin, json={"slots": [
        {"resourceId": res["id"], "startTime": start.isoformat(), "endTime": (start + dt.timedelta(hours=1)).isoformat(),
         "price": dearer}]}))["slots"][0]
    print(f"\n1b) the winner reschedules booking {done['id']} from slot {done.get('slotId')} to slot {slot['id']} "
          f"({slot.get('localStartTime', start.isoformat())}, {dearer['amountMinor']} {dearer['currencyCode']} minor units)")
    out = _ok(await c.post(f"/v1/checkouts/{done['id']}:reschedule", json={"slotId": slot["id"]},
                           headers={**head, "Idempotency-Key": uuid.uuid4().hex}))
    moved = out.get("reschedule") or {}
    diff = moved.get("difference") or {}
    print(f"   {out['state']} on slot {out.get('slotId')} ({moved.get('status')}): difference {diff.get('amountMinor', '0')} "
          f"{diff.get('currencyCode', '')} minor units charged (payment {moved.get('paymentId') or '-'}); the old slot "
          f"is bookable again")
    return out


async def cancel_after_purchase(c: httpx.AsyncClient, head: dict, done: dict) -> None:
    """The winner cancels the completed booking; its salon's policy decides the refund."""
    print(f"\n1c) the winner cancels booking {done['id']} (policy at purchase: free until "
          f"{done.get('freeCancellationHours', 0)} h before the start, then a {done.get('cancellationFeePercent', 0)} % fee; "
          f"free until {done.get('freeCancellationDeadline', '-')})")
    out = _ok(await c.post(f"/v1/checkouts/{done['id']}:cancel", json={}, headers=head))
    refund = out.get("refundAmount") or {}
    print(f"   {out['state']}: refunded {refund.get('amountMinor', '0')} {refund.get('currencyCode', '')} minor units; "
          f"the slot is bookable again")


async def salon_day(c: httpx.AsyncClient, secret: str, demo: dict) -> tuple[dict, list[dict]]:
    """Services and working hours (docs/booking.md): no slot rows, free times computed."""
    admin = _admin(secret, SALON_MERCHANT)
    salon = demo["salon_id"]
    run = uuid.uuid4().hex[:6]
    stylists = [_ok(await c.post(f"/v1/salons/{salon}/resources", json={"name": f"Stylist {n} {run}"},
                                 headers=admin))["id"] for n in ("Ayşe", "Deniz")]
    for rid in stylists:
        _ok(await c.post(f"/v1/salons/{salon}/resources/{rid}:setWorkingHours", headers=admin, json={
            "intervals": [{"weekday": d, "opens": "10:00", "closes": "19:00"} for d in range(1, 7)]}))
    _ok(await c.post(f"/v1/salons/{salon}:setBookingSettings", headers=admin,
                     json={"minNoticeMinutes": 60, "bookingHorizonDays": 60, "timeStepMinutes": 30}))
    service = _ok(await c.post(f"/v1/salons/{salon}/services", headers=admin, json={
        "name": f"Cut & style {run}", "durationMinutes": 45, "bufferAfterMinutes": 15, "resourceIds": stylists,
        "price": {"currencyCode": "TRY", "amountMinor": "90000"}}))
    day = _appointment(dt.time(10)).date()
    while day.isoweekday() == 7:  # the stylists do not work on Sundays
        day += dt.timedelta(days=1)
    print(f"\n1d) service {service['name']!r} (45 min + 15 min after) by 2 stylists, Mon-Sat 10:00-19:00")
    me = _auth(secret, f"day-{run}-0", "customer")
    free = _ok(await c.get(f"/v1/salons/{salon}/services/{service['id']}/availability", headers=me,
                           params={"startDay": day.isoformat(), "endDay": (day + dt.timedelta(days=6)).isoformat()}))
    times = free["times"]
    print(f"   availability for the week from {day}: {len(times)} free start times, e.g. "
          + ", ".join(f"{t['localStartTime'][5:16]} ({len(t['resourceIds'])} free)" for t in times[:3]))
    at = times[0]["startTime"]
    for i in range(3):
        who = _auth(secret, f"day-{run}-{i}", "customer", **{"Idempotency-Key": uuid.uuid4().hex})
        r = await c.post("/v1/checkouts", json={"serviceId": service["id"], "startTime": at}, headers=who)
        if r.status_code == 200:
            print(f"   customer {i} checks out {times[0]['localStartTime'][11:16]} with any free stylist: "
                  f"{r.json()['state']} (hold {r.json()['holdId']})")
            continue
        offer = r.json().get("heldAlternative") or {}
        local = (dt.datetime.fromisoformat(offer["startTime"].replace("Z", "+00:00")).astimezone(ZoneInfo(ZONE))
                 .isoformat()[:16] if offer else "-")
        print(f"   customer {i}: {r.status_code} {r.json()['type']}; held for them for 60 s (until "
              f"{offer.get('expireTime')}): {local} with stylist {offer.get('resourceId')}")
        if offer:
            took = _ok(await c.post("/v1/checkouts", json={"slotId": offer["slotId"]},
                                    headers={**who, "Idempotency-Key": uuid.uuid4().hex}))
            print(f"   customer {i} takes it with one call: checkout {took['id']} {took['state']} (hold {took['holdId']})")
    return service, times


async def receptionist(c: httpx.AsyncClient, secret: str, demo: dict, service: dict, times: list[dict]) -> None:
    """Staff book for a customer (docs/checkout.md, "Staff book for a customer"): a walk-in paying at
    the desk, and a caller paying through a link on the PSP's hosted page."""
    times = [t for t in times if t["localStartTime"][:10] != times[0]["localStartTime"][:10]][::4]  # another day
    if len(times) < 3:
        return
    staff = _auth(secret, "demo-receptionist", "staff", merchant=SALON_MERCHANT)
    print("\n1e) the phone rings: the receptionist books for customers (they never pick a card for them)")
    walk_in = _ok(await c.post("/v1/checkouts:createForCustomer", headers={**staff, "Idempotency-Key": uuid.uuid4().hex},
                               json={"serviceId": service["id"], "startTime": times[1]["startTime"],
                                     "contact": {"name": "Elif (walk-in)", "phone": "+905321234567"},
                                     "settlement": "SETTLEMENT_AT_VENUE"}))
    b = walk_in["staffBooking"]
    print(f"   {times[1]['localStartTime'][5:16]} for guest {b['customerId']}, pay at the venue: {walk_in['state']}, "
          f"{b['venuePayment']['status']}")
    paid = _ok(await c.post(f"/v1/checkouts/{walk_in['id']}:markPaid", headers=staff, json={
        "method": "VENUE_PAYMENT_METHOD_CASH", "amount": walk_in["amount"], "reference": "receipt 0001"}))
    v = paid["staffBooking"]["venuePayment"]
    print(f"   after the cut: marked {v['status']} ({v['method'].removeprefix('VENUE_PAYMENT_METHOD_').lower()}, "
          f"{v['amount']['amountMinor']} {v['amount']['currencyCode']}, {v['reference']})")
    caller = f"demo-caller-{uuid.uuid4().hex[:6]}"
    linked = _ok(await c.post("/v1/checkouts:createForCustomer", headers={**staff, "Idempotency-Key": uuid.uuid4().hex},
                              json={"serviceId": service["id"], "startTime": times[2]["startTime"],
                                    "customerId": caller, "settlement": "SETTLEMENT_PAYMENT_LINK",
                                    "linkTtlSeconds": 3600}))
    link = linked["staffBooking"]["linkUrl"]
    print(f"   {times[2]['localStartTime'][5:16]} for {caller}, payment link (held until "
          f"{linked['staffBooking']['linkExpireTime']}): {linked['state']}\n   link: {link}")
    async with httpx.AsyncClient(timeout=10) as browser:  # the customer opens the link and pays
        _ok(await browser.post(link, data={"payment_method": "pm_card_ok"}))
    done = await _until_terminal(c, linked["id"], _auth(secret, caller, "customer"))
    mine = _ok(await c.get("/v1/checkouts", headers=_auth(secret, caller, "customer")))["checkouts"]
    print(f"   the customer paid on the PSP's page: {done['state']}; their own list shows {len(mine)} booking(s)")


async def buy_code(c: httpx.AsyncClient, secret: str, demo: dict) -> tuple[str, str]:
    me = _auth(secret, "demo-customer", "customer")
    print(f"\n2) a customer buys one code of product {demo['product_id']}")
    co = _ok(await c.post("/v1/checkouts", json={"productId": demo["product_id"], "quantity": 1},
                          headers={**me, "Idempotency-Key": uuid.uuid4().hex}))
    print(f"   checkout {co['id']} {co['state']}, amount {co.get('amount')}")
    paid = _ok(await c.post(f"/v1/checkouts/{co['id']}:pay", json={"paymentMethod": "pm_card_ok"},
                            headers={**me, "Idempotency-Key": uuid.uuid4().hex}))
    done = await _until_terminal(c, co["id"], me)
    print(f"   {done['state']}; codes: {', '.join(x.get('value', '(hidden)') for x in done.get('codes', [])) or '-'}")
    return co["id"], (done.get("payment") or paid.get("payment") or {}).get("id", "")


async def claim_and_replace(c: httpx.AsyncClient, secret: str, checkout_id: str) -> None:
    """After the sale (docs/codepool.md, "Claims"): the buyer claims the code, the shop's admin
    replaces it; the buyer's checkout shows the new code, never the revoked one."""
    me = _auth(secret, "demo-customer", "customer")
    before = _ok(await c.get(f"/v1/checkouts/{checkout_id}", headers=me)).get("codes", [])
    if not before:
        return
    code = before[0]
    print(f"\n2b) the buyer says code {code.get('value', code['id'])} does not work, and claims it")
    claim = _ok(await c.post(f"/v1/checkouts/{checkout_id}/codes/{code['id']}:claim",
                             json={"kind": "CLAIM_KIND_DOES_NOT_WORK", "reason": "the shop refuses the pin"},
                             headers={**me, "Idempotency-Key": uuid.uuid4().hex}))
    print(f"   claim {claim['id']} {claim['status']}")
    done = _ok(await c.post(f"/v1/claims/{claim['id']}:resolve",
                            json={"resolution": "CLAIM_RESOLUTION_REPLACE", "note": "replaced from stock"},
                            headers={**_admin(secret, SHOP_MERCHANT), "Idempotency-Key": uuid.uuid4().hex}))
    print(f"   {SHOP_MERCHANT}'s admin resolves it: {done['status']}, new code {done.get('replacementCodeId')}")
    after = _ok(await c.get(f"/v1/checkouts/{checkout_id}", headers=me)).get("codes", [])
    print(f"   the buyer's codes now: {', '.join(x.get('value', x['id']) for x in after)} (the claimed one is revoked)")
    await asyncio.sleep(1.5)  # the claim's events reach the payment timeline through the relay (polls every second)


async def timeline(c: httpx.AsyncClient, secret: str, payment_id: str) -> None:
    print(f"\n3) timeline of payment {payment_id}, read by {SHOP_MERCHANT}'s staff")
    events = _ok(await c.get(f"/v1/payments/{payment_id}/events",
                             headers=_auth(secret, "demo-staff", "staff", merchant=SHOP_MERCHANT)))
    print(f"   {'seq':>3}  {'source':<10} {'from':<16} {'to':<16} {'ver':>3}  {'trace id':<32}  time")
    for e in events.get("events", []):
        print(f"   {e.get('seq', '0'):>3}  {e.get('source', ''):<10} {e.get('fromStatus', '-'):<16} {e.get('toStatus', ''):<16} "
              f"{e.get('version', '0'):>3}  {e.get('traceId', ''):<32}  {e.get('createTime', '')}")


async def main_async() -> int:
    data_dir = pathlib.Path(os.environ.get("CUTY_DATA_DIR") or ".cuty").absolute()
    try:
        state = json.loads((data_dir / "devstack.json").read_text())
    except (OSError, ValueError):
        state = {}
    base = state.get("gateway_url") or f"http://127.0.0.1:{os.environ.get('CUTY_HTTP_PORT') or 8080}"
    secret = os.environ.get("CUTY_JWT_SECRET") or __import__("cutylib.config", fromlist=["x"]).DEV_JWT_SECRET
    try:
        httpx.get(f"{base}/healthz", timeout=3)
    except httpx.HTTPError:
        print(f"no gateway at {base}: start the platform with `make run` first", file=sys.stderr)
        return 1
    demo = ensure_demo_data(base, secret, data_dir)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=httpx.Limits(max_connections=64)) as c:
        winner = await race(c, secret, demo)
        if winner is not None:
            head, done = winner
            moved = await reschedule(c, secret, demo, head, done)
            await cancel_after_purchase(c, head, moved)
        service, times = await salon_day(c, secret, demo)
        await receptionist(c, secret, demo, service, times)
        checkout_id, payment_id = await buy_code(c, secret, demo)
        await claim_and_replace(c, secret, checkout_id)
        if payment_id:
            await timeline(c, secret, payment_id)
        await merchants_apart(c, secret, checkout_id)
    return 0


async def merchants_apart(c: httpx.AsyncClient, secret: str, checkout_id: str) -> None:
    """One merchant's staff cannot see another merchant's sales."""
    print(f"\n4) merchants are tenants: checkout {checkout_id} bought a {SHOP_MERCHANT} product")
    for merchant in (SHOP_MERCHANT, SALON_MERCHANT):
        r = await c.get(f"/v1/checkouts/{checkout_id}", headers=_auth(secret, "demo-staff", "staff", merchant=merchant))
        seen = (f"{r.json()['state']}" if r.status_code == 200 else r.json().get("title", ""))
        print(f"   staff of {merchant:<12} -> {r.status_code} {seen}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main_async()))
