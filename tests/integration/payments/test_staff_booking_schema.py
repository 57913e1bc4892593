"""What the payments database guarantees of staff-made bookings (migration 0020_staff_checkouts):
guest customers one per merchant and contact, their contact checked, every merchant seeing only its
own; a venue payment recorded whole; a paid booking never a no-show."""
from __future__ import annotations

import uuid

import asyncpg
import pytest


async def _insert_guest(conn, merchant: str, name: str = "Caller", phone: str | None = "+4915112345678",
                        email: str | None = None):
    return await conn.fetchval("INSERT INTO guest_customers (merchant_id, name, phone, email) VALUES ($1, $2, $3, $4) "
                               "RETURNING id", merchant, name, phone, email)


async def test_guest_contacts_are_checked_and_one_per_merchant(payments_dsn):
    conn = await asyncpg.connect(payments_dsn)
    merchant = f"m-{uuid.uuid4().hex[:8]}"
    try:
        first = await _insert_guest(conn, merchant)
        with pytest.raises(asyncpg.UniqueViolationError):
            await _insert_guest(conn, merchant)
        other = await _insert_guest(conn, merchant + "-b")  # the same phone at another merchant: another guest
        assert other != first
        # the e-mail is the key when there is no phone, whatever its case
        await _insert_guest(conn, merchant, phone=None, email="Ayse@Example.com")
        with pytest.raises(asyncpg.UniqueViolationError):
            await _insert_guest(conn, merchant, phone=None, email="ayse@example.com")
        for phone, email in (("015112345678", None), ("+49 151 1234", None), (None, "no-at-sign"),
                             (None, "a@b"), (None, None)):
            with pytest.raises(asyncpg.CheckViolationError):
                await _insert_guest(conn, merchant + "-x", phone=phone, email=email)
    finally:
        await conn.close()


async def test_a_merchant_sees_only_its_own_guests(payments_dsn, payments_service_dsn):
    owner = await asyncpg.connect(payments_dsn)
    a, b = f"m-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"
    try:
        await _insert_guest(owner, a, phone="+905321111111")
        await _insert_guest(owner, b, phone="+905322222222")
    finally:
        await owner.close()
    conn = await asyncpg.connect(payments_service_dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('cuty.merchant', $1, true)", a)
            seen = await conn.fetch("SELECT merchant_id FROM guest_customers WHERE merchant_id = ANY ($1::text[])",
                                    [a, b])
            assert {r["merchant_id"] for r in seen} == {a}
            with pytest.raises(asyncpg.InsufficientPrivilegeError):  # nor writes another's
                await _insert_guest(conn, b, phone="+905323333333")
    finally:
        await conn.close()


async def test_a_venue_payment_is_recorded_whole_and_a_paid_booking_is_no_no_show(payments_dsn):
    conn = await asyncpg.connect(payments_dsn)
    try:
        cid = await conn.fetchval(
            "INSERT INTO checkouts (id, customer_id, kind, slot_id, settle, created_by, venue_status) "
            "VALUES (gen_random_uuid(), 'guest:x', 'booking', gen_random_uuid(), 'venue', 'staff:s', 'unpaid') "
            "RETURNING id")
        with pytest.raises(asyncpg.CheckViolationError):  # paid, but how and for what not said
            await conn.execute("UPDATE checkouts SET venue_status = 'paid' WHERE id = $1", cid)
        await conn.execute("UPDATE checkouts SET venue_status = 'paid', venue_method = 'cash', venue_amount_minor = 100, "
                           "venue_reference = 'r1', venue_paid_at = now() WHERE id = $1", cid)
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE checkouts SET no_show_at = now(), no_show_by = 'staff:s' WHERE id = $1", cid)
        with pytest.raises(asyncpg.CheckViolationError):  # a venue booking is unpaid or paid, never unknown
            await conn.execute(
                "INSERT INTO checkouts (id, customer_id, kind, slot_id, settle, created_by) "
                "VALUES (gen_random_uuid(), 'guest:x', 'booking', gen_random_uuid(), 'venue', 'staff:s')")
        with pytest.raises(asyncpg.CheckViolationError):  # a link lives 1 s .. a day
            await conn.execute(
                "INSERT INTO checkouts (id, customer_id, kind, slot_id, settle, created_by, link_ttl_seconds) "
                "VALUES (gen_random_uuid(), 'guest:x', 'booking', gen_random_uuid(), 'link', 'staff:s', 86401)")
        await conn.execute("DELETE FROM checkouts WHERE id = $1", cid)  # PENDING: may go
    finally:
        await conn.close()


async def test_a_no_show_fee_is_charged_only_as_accepted(payments_dsn):
    """The database's guarantees of the no-show fee (migration 0120_no_show_fee): never due without
    the customer's acceptance or before a no-show, never charged without its payment; an
    off-session charge names the PSP's customer."""
    conn = await asyncpg.connect(payments_dsn)
    try:
        plain = await conn.fetchval(
            "INSERT INTO checkouts (id, customer_id, kind, slot_id, amount_minor, currency) "
            "VALUES (gen_random_uuid(), 'c1', 'booking', gen_random_uuid(), 1000, 'TRY') RETURNING id")
        await conn.execute("UPDATE checkouts SET no_show_at = now(), no_show_by = 'staff:s' WHERE id = $1", plain)
        with pytest.raises(asyncpg.CheckViolationError):  # no acceptance: nothing is ever due
            await conn.execute("UPDATE checkouts SET no_show_fee_status = 'due' WHERE id = $1", plain)
        for fee, at in ((0, "now()"), (500, "NULL")):  # none, or accepted at no time
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(f"UPDATE checkouts SET no_show_fee_minor = {fee}, no_show_fee_accepted_at = {at} "
                                   "WHERE id = $1", plain)
        accepted = await conn.fetchval(
            "INSERT INTO checkouts (id, customer_id, kind, slot_id, amount_minor, currency, no_show_fee_minor, "
            "no_show_fee_accepted_at) VALUES (gen_random_uuid(), 'c1', 'booking', gen_random_uuid(), 1000, 'TRY', "
            "200, now()) RETURNING id")
        with pytest.raises(asyncpg.CheckViolationError):  # not before a no-show
            await conn.execute("UPDATE checkouts SET no_show_fee_status = 'due' WHERE id = $1", accepted)
        await conn.execute("UPDATE checkouts SET no_show_at = now(), no_show_by = 'staff:s', no_show_fee_status = 'due' "
                           "WHERE id = $1", accepted)
        with pytest.raises(asyncpg.CheckViolationError):  # charged names its payment
            await conn.execute("UPDATE checkouts SET no_show_fee_status = 'charged' WHERE id = $1", accepted)
        with pytest.raises(asyncpg.CheckViolationError):  # an off-session charge is a saved card's customer's
            await conn.execute(
                "INSERT INTO payments (id, amount_minor, currency, payment_method, idempotency_key, merchant_id, "
                "off_session) VALUES (gen_random_uuid(), 200, 'TRY', 'pm_saved_x', 'k-' || gen_random_uuid(), 'm', "
                "'charge')")
    finally:
        await conn.close()


async def test_a_payment_links_customer_accepts_exactly_its_offer(payments_dsn):
    """Migration 0230_link_no_show_fee: a no-show fee is offered by a payment link only, and what
    its customer accepts is that offer, never another amount; the link's payment asks consent to a
    later off-session charge on the hosted page only, never above its own amount."""
    conn = await asyncpg.connect(payments_dsn)
    try:
        link = await conn.fetchval(
            "INSERT INTO checkouts (id, customer_id, kind, slot_id, settle, created_by, link_ttl_seconds, "
            "no_show_fee_offered_minor) VALUES (gen_random_uuid(), 'guest:x', 'booking', gen_random_uuid(), 'link', "
            "'staff:s', 600, 300) RETURNING id")
        with pytest.raises(asyncpg.CheckViolationError):  # not the offer
            await conn.execute("UPDATE checkouts SET no_show_fee_minor = 299, no_show_fee_accepted_at = now() "
                               "WHERE id = $1", link)
        await conn.execute("UPDATE checkouts SET no_show_fee_minor = 300, no_show_fee_accepted_at = now() WHERE id = $1",
                           link)
        for settle in ("'venue', 'staff:s', NULL, 'unpaid'", "NULL, NULL, NULL, NULL"):  # no link, no offer
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(
                    "INSERT INTO checkouts (id, customer_id, kind, slot_id, settle, created_by, link_ttl_seconds, "
                    f"venue_status, no_show_fee_offered_minor) VALUES (gen_random_uuid(), 'c', 'booking', "
                    f"gen_random_uuid(), {settle}, 300)")
        payment = ("INSERT INTO payments (id, amount_minor, currency, payment_method, idempotency_key, merchant_id, "
                   "off_session, consent_minor) VALUES (gen_random_uuid(), 1000, 'TRY', $1, 'k-' || gen_random_uuid(), "
                   "'m', $2, $3)")
        await conn.execute(payment, "hosted_page", "setup", 300)
        for method, off_session, consent in (("pm_card_ok", "setup", 300), ("hosted_page", None, 300),
                                             ("hosted_page", "setup", 1001), ("hosted_page", "setup", 0)):
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(payment, method, off_session, consent)
    finally:
        await conn.close()
