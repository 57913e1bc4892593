"""Merchants as tenants in booking (docs/tenancy.md, "Booking").

A salon is its admin's merchant's; resources, slots and holds are their salon's merchant's. Staff
and admins see and change only their merchant's (another merchant's salon answers NOT_FOUND exactly
like a missing one); customers, the operator and the system see every merchant. The database
refuses a row moving between merchants, and Row-Level Security returns nothing to a session set
to the wrong merchant.
"""
from __future__ import annotations

from datetime import timedelta

import asyncpg
import grpc
import pytest

from booking_harness import at, tomorrow
from cuty.booking.v1 import booking_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib.testing.ids import new_id
from cutylib.testing.tenancy import probe_role, rows_seen
from cutylib.testing.trust import TEST_MERCHANT, user

TABLES = ("salons", "resources", "slots", "holds")
# services and working hours (docs/booking.md): merchant tables like the rest
SCHEDULE_TABLES = ("services", "service_resources", "working_hours", "hours_overrides")
# finished holds, moved by the retention job (docs/booking.md, "Retention"): partitioned, each
# partition with the same policy (tests/integration/booking/test_holds_retention.py)
HISTORY_TABLES = ("holds_history",)
T = tomorrow(10)
H = timedelta(hours=1)


def admin(org: str | None = None):
    return user(new_id(), "admin", org)


async def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code(), e.value.details()


async def _merchant_salon(booking, org: str) -> tuple[str, str, pb.Slot]:
    """A salon of merchant `org` with one chair and one slot tomorrow at 10."""
    md = admin(org)
    salon = await booking.stub.CreateSalon(pb.CreateSalonRequest(name="Salon " + new_id()[:8],
                                                                 time_zone="Europe/Istanbul"), metadata=md)
    chair = await booking.stub.CreateResource(pb.CreateResourceRequest(salon_id=salon.id, name="chair"), metadata=md)
    slots = await booking.stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(salon_id=salon.id, slots=[
        pb.SlotInput(resource_id=chair.id, start_time=at(T), end_time=at(T + H),
                     price=common_pb2.Money(currency_code="TRY", amount_minor=50000))]), metadata=md)
    return salon.id, chair.id, slots.slots[0]


def _list(salon_id: str) -> pb.ListSlotsRequest:
    return pb.ListSlotsRequest(salon_id=salon_id, start_time=at(T - H), end_time=at(T + 2 * H))


def _same_shape(a: str, b: str, *ids: str) -> bool:
    for i in ids:
        a, b = a.replace(i, "<id>"), b.replace(i, "<id>")
    return a == b


async def test_create_salon_puts_it_in_the_admins_merchant(booking, booking_pool):
    org = "m-" + new_id()
    salon = await booking.stub.CreateSalon(pb.CreateSalonRequest(name="Kuaför", time_zone="Europe/Istanbul"),
                                           metadata=admin(org))
    assert salon.merchant_id == org
    assert await booking_pool.fetchval("SELECT merchant_id FROM salons WHERE id = $1", salon.id) == org
    default = await booking.stub.CreateSalon(pb.CreateSalonRequest(name="Kuaför", time_zone="UTC"), metadata=admin())
    assert default.merchant_id == TEST_MERCHANT


async def test_children_and_holds_carry_the_salons_merchant(booking, booking_pool):
    org = "m-" + new_id()
    salon, chair, slot = await _merchant_salon(booking, org)
    hold = await booking.hold(slot.id)
    assert hold.merchant_id == org
    assert (await booking.stub.GetHold(pb.GetHoldRequest(hold_id=hold.id))).merchant_id == org
    confirmed = await booking.stub.ConfirmHold(pb.ConfirmHoldRequest(hold_id=hold.id, payment_ref="pay-" + new_id()))
    assert confirmed.merchant_id == org
    rows = await booking_pool.fetch(
        "SELECT merchant_id FROM resources WHERE id = $1 UNION ALL SELECT merchant_id FROM slots WHERE id = $2 "
        "UNION ALL SELECT merchant_id FROM holds WHERE id = $3", chair, slot.id, hold.id)
    assert [r["merchant_id"] for r in rows] == [org, org, org]


async def test_admin_writes_only_into_its_own_merchants_salons(booking, booking_pool):
    mine, other = "m-" + new_id(), "m-" + new_id()
    salon, chair, _ = await _merchant_salon(booking, other)
    missing = new_id()
    slot = pb.SlotInput(resource_id=chair, start_time=at(T + 3 * H), end_time=at(T + 4 * H),
                        price=common_pb2.Money(currency_code="TRY", amount_minor=1))
    for make in (lambda s: booking.stub.CreateResource(pb.CreateResourceRequest(salon_id=s, name="x"),
                                                       metadata=admin(mine)),
                 lambda s: booking.stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(salon_id=s, slots=[slot]),
                                                         metadata=admin(mine))):
        code, detail = await _code(make(salon))
        missing_code, missing_detail = await _code(make(missing))
        assert code == missing_code == grpc.StatusCode.NOT_FOUND
        assert _same_shape(detail, missing_detail, salon, missing), (detail, missing_detail)
    assert await booking_pool.fetchval("SELECT count(*) FROM resources WHERE salon_id = $1", salon) == 1
    assert await booking_pool.fetchval("SELECT count(*) FROM slots WHERE salon_id = $1", salon) == 1


@pytest.mark.parametrize("role", ["staff", "admin"])
async def test_staff_and_admins_list_only_their_merchants_slots(booking, role):
    mine, other = "m-" + new_id(), "m-" + new_id()
    own_salon, _, own_slot = await _merchant_salon(booking, mine)
    other_salon, _, _ = await _merchant_salon(booking, other)
    md = user(new_id(), role, mine)
    got = await booking.stub.ListSlots(_list(own_salon), metadata=md)
    assert [s.id for s in got.slots] == [own_slot.id]
    code, detail = await _code(booking.stub.ListSlots(_list(other_salon), metadata=md))
    missing = new_id()
    missing_code, missing_detail = await _code(booking.stub.ListSlots(_list(missing), metadata=md))
    assert code == missing_code == grpc.StatusCode.NOT_FOUND
    assert _same_shape(detail, missing_detail, other_salon, missing)


@pytest.mark.parametrize("role", ["customer", "operator"])
async def test_customers_and_the_operator_list_any_merchants_slots(booking, role):
    salon, _, slot = await _merchant_salon(booking, "m-" + new_id())
    got = await booking.stub.ListSlots(_list(salon), metadata=user(new_id(), role))
    assert [s.id for s in got.slots] == [slot.id]


async def test_an_org_that_owns_nothing_sees_nothing(booking):
    salon, chair, slot = await _merchant_salon(booking, "m-" + new_id())
    nobody = "m-nothing-" + new_id()
    for role in ("staff", "admin"):
        md = user(new_id(), role, nobody)
        assert (await _code(booking.stub.ListSlots(_list(salon), metadata=md)))[0] == grpc.StatusCode.NOT_FOUND
    assert (await _code(booking.stub.CreateResource(pb.CreateResourceRequest(salon_id=salon, name="x"),
                                                    metadata=admin(nobody))))[0] == grpc.StatusCode.NOT_FOUND


async def test_staff_and_admins_without_a_merchant_are_unauthenticated(booking):
    salon, _, _ = await _merchant_salon(booking, "m-" + new_id())
    calls = [
        lambda md: booking.stub.CreateSalon(pb.CreateSalonRequest(name="n", time_zone="UTC"), metadata=md),
        lambda md: booking.stub.CreateResource(pb.CreateResourceRequest(salon_id=salon, name="x"), metadata=md),
        lambda md: booking.stub.ListSlots(_list(salon), metadata=md),
    ]
    for role in ("staff", "admin"):
        for call in calls:
            code, _ = await _code(call(user(new_id(), role, "")))
            assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_no_merchants_user_reaches_the_hold_rpcs(booking):
    """Hold RPCs are the orchestrator's (as `system`); only the gateway brings users and it has no
    route to them, so a merchant's user is refused on every one, its own merchant's holds too."""
    mine, other = "m-" + new_id(), "m-" + new_id()
    _, _, own_slot = await _merchant_salon(booking, mine)
    _, _, other_slot = await _merchant_salon(booking, other)
    own = await booking.hold(own_slot.id)
    staff = user(new_id(), "staff", mine)
    for call in (booking.stub.GetHold(pb.GetHoldRequest(hold_id=own.id), metadata=staff),
                 booking.stub.ExtendHold(pb.ExtendHoldRequest(hold_id=own.id), metadata=staff),
                 booking.stub.GetSlot(pb.GetSlotRequest(slot_id=own_slot.id), metadata=staff),
                 booking.stub.HoldSlot(pb.HoldSlotRequest(slot_id=other_slot.id, customer_id=new_id(),
                                                          request_id=new_id()), metadata=staff)):
        assert (await _code(call))[0] == grpc.StatusCode.PERMISSION_DENIED


async def test_a_customer_books_across_merchants_and_the_cap_spans_them(booking):
    customer = new_id()
    slots = [(await _merchant_salon(booking, "m-" + new_id()))[2] for _ in range(booking.settings.max_active_holds + 1)]
    holds = [await booking.hold(s.id, customer) for s in slots[:-1]]
    assert len({h.merchant_id for h in holds}) == len(holds)
    code, _ = await _code(booking.hold(slots[-1].id, customer))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_the_request_id_is_a_key_within_the_slots_merchant(booking):
    """HoldSlot's idempotency key is (merchant, customer, request id): a retry finds its hold,
    another slot of the same merchant is request-id-reused, another merchant's is a new hold."""
    customer, request = new_id(), new_id()
    org = "m-" + new_id()
    salon, chair, slot = await _merchant_salon(booking, org)
    second = (await booking.stub.BatchCreateSlots(pb.BatchCreateSlotsRequest(salon_id=salon, slots=[
        pb.SlotInput(resource_id=chair, start_time=at(T + 2 * H), end_time=at(T + 3 * H),
                     price=common_pb2.Money(currency_code="TRY", amount_minor=1))]), metadata=admin(org))).slots[0]
    elsewhere = (await _merchant_salon(booking, "m-" + new_id()))[2]
    first = await booking.hold(slot.id, customer, request)
    assert (await booking.hold(slot.id, customer, request)).id == first.id
    assert (await _code(booking.hold(second.id, customer, request)))[0] == grpc.StatusCode.INVALID_ARGUMENT
    other = await booking.hold(elsewhere.id, customer, request)
    assert other.id != first.id and other.merchant_id != first.merchant_id


@pytest.mark.parametrize("table", TABLES)
async def test_a_row_never_moves_between_merchants(booking, booking_pool, table):
    _, _, slot = await _merchant_salon(booking, "m-" + new_id())
    hold = await booking.hold(slot.id)
    row_id = {"salons": slot.salon_id, "resources": slot.resource_id, "slots": slot.id, "holds": hold.id}[table]
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never changes"):
        await booking_pool.execute(f"UPDATE {table} SET merchant_id = 'm-elsewhere' WHERE id = $1", row_id)


async def test_a_child_cannot_take_another_merchant_than_its_parents(booking, booking_pool):
    salon, chair, slot = await _merchant_salon(booking, "m-" + new_id())
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await booking_pool.execute("INSERT INTO resources (id, merchant_id, salon_id, name) VALUES ($1, 'm-x', $2, 'r')",
                                   new_id(), salon)
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await booking_pool.execute(
            "INSERT INTO slots (id, merchant_id, salon_id, resource_id, start_time, end_time, price_minor, currency) "
            "VALUES ($1, 'm-x', $2, $3, $4, $5, 1, 'TRY')", new_id(), salon, chair, T + 5 * H, T + 6 * H)
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await booking_pool.execute(
            "INSERT INTO holds (id, merchant_id, slot_id, salon_id, resource_id, customer_id, request_id, start_time, "
            "                   end_time, price_minor, currency, expires_at) "
            "SELECT $1, 'm-x', s.id, s.salon_id, s.resource_id, 'c', 'r', s.start_time, s.end_time, 1, 'TRY', "
            "       clock_timestamp() + interval '5 minutes' FROM slots s WHERE s.id = $2", new_id(), slot.id)


async def test_row_level_security_bites(booking, booking_dsn):
    """A non-superuser session set to the wrong merchant reads nothing of any table (unset: all);
    set to the merchant, it reads that merchant's rows (superusers bypass RLS, hence a probe role)."""
    org = "m-" + new_id()
    _, _, slot = await _merchant_salon(booking, org)
    await booking.hold(slot.id)
    conn = await asyncpg.connect(booking_dsn)
    try:
        async with probe_role(conn) as role:
            counts = {s: [await rows_seen(conn, role, t, s) for t in TABLES] for s in ("wrong", org, None, "*")}
    finally:
        await conn.close()
    # a forgotten WHERE still sees only the merchant: the whole table is its 1 + 1 + 1 + 1 rows
    assert {s: counts[s] for s in ("wrong", org)} == {"wrong": [0, 0, 0, 0], org: [1, 1, 1, 1]}
    # unset is nobody's (fail closed); only an explicit '*' is every merchant
    assert counts[None] == [0, 0, 0, 0] and all(n >= 1 for n in counts["*"])


async def test_every_merchant_table_has_row_level_security_and_keys_lead_with_the_merchant(booking_pool):
    tables = await booking_pool.fetch("""
        SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
               EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid) AS has_policy
          FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'merchant_id' AND NOT a.attisdropped
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition""")
    assert sorted(r["relname"] for r in tables) == sorted(TABLES + SCHEDULE_TABLES + HISTORY_TABLES)
    for r in tables:
        assert r["relrowsecurity"] and r["relforcerowsecurity"] and r["has_policy"], r["relname"]
    # Unique and exclusion constraints (the primary keys on random uuids aside) lead with merchant_id.
    keys = await booking_pool.fetch("""
        SELECT conrelid::regclass::text AS t, conname, (SELECT attname FROM pg_attribute
                WHERE attrelid = conrelid AND attnum = conkey[1]) AS first
          FROM pg_constraint
         WHERE connamespace = 'public'::regnamespace AND contype IN ('u', 'x', 'f')""")
    assert {k["conname"] for k in keys
            if k["t"] in TABLES + SCHEDULE_TABLES and k["first"] != "merchant_id"} == set()

