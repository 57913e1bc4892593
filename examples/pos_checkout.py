"""A point of sale on the platform's gRPC API with cuty-client (docs/clients.md).

It is an internal client with its own certificate, registered in the services'
CUTY_INTERNAL_CLIENTS as acting as itself (the till is the buyer of record: role `customer`) and
allowed to forward its customers' tokens:

    {"clients": [{"identity": "pos", "acts_as": {"role": "customer", "subject": "pos-till-1"},
                  "users": ["customer"]}]}

As itself it finds a free slot of a salon and books it, and sells a code, each paid in one call;
for a customer who signed in at the till (their token) it sells a code in that customer's name.
One JSON object per line on stdout says what happened.

    python examples/pos_checkout.py --ca ca.crt --cert pos.crt --key pos.key \
        --payments host:port --booking host:port --codepool host:port \
        --salon SALON_ID --product PRODUCT_ID [--customer-token JWT] [--payment-method pm_card_ok]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys

from cuty_client import CutyClient, CutyError, OutOfStock, SlotTaken, Tls, checkout_pb2


def _state(c: checkout_pb2.Checkout) -> str:
    return checkout_pb2.CheckoutState.Name(c.state).removeprefix("CHECKOUT_STATE_")


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def book_a_slot(cuty: CutyClient, salon_id: str, method: str) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    page = await cuty.list_slots(salon_id, now, now + dt.timedelta(days=30), available_only=True, page_size=20)
    for slot in page.slots:
        try:
            c = await cuty.create_checkout(slot_id=slot.id, payment_method=method)
        except SlotTaken as taken:  # another till or a web buyer was faster: take the offer, if any
            say(step="slot", outcome="taken", slot_id=slot.id, alternatives=[a.id for a in taken.alternatives],
                held_offer=taken.held_offer.slot_id if taken.held_offer is not None else "")
            continue
        say(step="slot", outcome=_state(c), checkout_id=c.id, slot_id=slot.id)
        return
    say(step="slot", outcome="none-free")


async def sell_a_code(cuty: CutyClient, product_id: str, method: str, step: str) -> None:
    try:
        c = await cuty.create_checkout(product_id=product_id, quantity=1, payment_method=method)
    except OutOfStock as e:
        say(step=step, outcome="out-of-stock", available=e.available)
        return
    say(step=step, outcome=_state(c), checkout_id=c.id, codes=len(c.codes))


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("ca", "cert", "key", "payments", "booking", "codepool", "salon", "product"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--customer-token", default=os.environ.get("POS_CUSTOMER_TOKEN", ""))
    ap.add_argument("--payment-method", default="pm_card_ok")
    ap.add_argument("--deadline", type=float, default=15.0)
    a = ap.parse_args(argv)
    tls = Tls(ca=a.ca, cert=a.cert, key=a.key)
    async with CutyClient(tls, payments=a.payments, booking=a.booking, codepool=a.codepool,
                          deadline=a.deadline) as cuty:
        try:
            await book_a_slot(cuty, a.salon, a.payment_method)
            await sell_a_code(cuty, a.product, a.payment_method, "code")
            if a.customer_token:
                await sell_a_code(cuty.for_user(a.customer_token), a.product, a.payment_method, "code-for-customer")
        except CutyError as e:
            say(step="error", problem=e.problem())
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
