"""The database itself refuses what the API refuses, for any writer (docs/architecture.md: invariants
live in constraints)."""
import pathlib

import asyncpg
import pytest

from booking_harness import tomorrow
from cutylib.db import SHARED_MIGRATIONS
from cutylib.testing.ids import new_id


M = "m-schema"


async def _catalog(pool, merchant: str = M):
    salon, resource = new_id(), new_id()
    await pool.execute("INSERT INTO salons (id, merchant_id, name, time_zone) VALUES ($1, $2, 's', 'Europe/Istanbul')",
                       salon, merchant)
    await pool.execute("INSERT INTO resources (id, merchant_id, salon_id, name) VALUES ($1, $2, $3, 'r')",
                       resource, merchant, salon)
    return salon, resource


@pytest.mark.parametrize("tz", ["+03", "Mars/Base", "localtime", "EST5EDTX"])
async def test_salon_zone_must_be_iana(booking_pool, tz):
    with pytest.raises(asyncpg.CheckViolationError):
        await booking_pool.execute("INSERT INTO salons (id, merchant_id, name, time_zone) VALUES ($1, $2, 's', $3)",
                                   new_id(), M, tz)


@pytest.mark.parametrize("start_h, end_h, price, currency", [(10, 10, 1, "TRY"), (10, 11, -1, "TRY"), (10, 11, 1, "try")])
async def test_slot_checks(booking_pool, start_h, end_h, price, currency):
    salon, resource = await _catalog(booking_pool)
    with pytest.raises(asyncpg.CheckViolationError):
        await booking_pool.execute(
            "INSERT INTO slots (id, merchant_id, salon_id, resource_id, start_time, end_time, price_minor, currency) "
            "VALUES ($1, 'm-schema', $2, $3, $4, $5, $6, $7)", new_id(), salon, resource, tomorrow(start_h), tomorrow(end_h),
            price, currency)


async def test_slot_resource_must_belong_to_its_salon(booking_pool):
    salon, _ = await _catalog(booking_pool)
    _, foreign = await _catalog(booking_pool)
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await booking_pool.execute(
            "INSERT INTO slots (id, merchant_id, salon_id, resource_id, start_time, end_time, price_minor, currency) "
            "VALUES ($1, 'm-schema', $2, $3, $4, $5, 1, 'TRY')", new_id(), salon, foreign, tomorrow(10), tomorrow(11))


async def test_active_holds_cannot_overlap_on_a_resource(booking_pool):
    salon, resource = await _catalog(booking_pool)
    slot_a, slot_b = new_id(), new_id()
    insert_slot = ("INSERT INTO slots (id, merchant_id, salon_id, resource_id, start_time, end_time, price_minor, currency) "
                   "VALUES ($1, 'm-schema', $2, $3, $4, $5, 1, 'TRY')")
    await booking_pool.execute(insert_slot, slot_a, salon, resource, tomorrow(10), tomorrow(12))
    await booking_pool.execute(insert_slot, slot_b, salon, resource, tomorrow(11), tomorrow(13))
    insert_hold = """
        INSERT INTO holds (id, merchant_id, slot_id, salon_id, resource_id, customer_id, request_id, status, start_time,
                           end_time, price_minor, currency, expires_at, payment_ref)
        SELECT $1, s.merchant_id, s.id, s.salon_id, s.resource_id, $3, $6, $4, s.start_time, s.end_time, 1, 'TRY',
               clock_timestamp() + interval '5 minutes', $5
          FROM slots s WHERE s.id = $2"""
    await booking_pool.execute(insert_hold, new_id(), slot_a, "c1", "confirmed", "pay", new_id())
    with pytest.raises(asyncpg.ExclusionViolationError):
        await booking_pool.execute(insert_hold, new_id(), slot_b, "c2", "held", None, new_id())
    # inactive rows do not block
    await booking_pool.execute(insert_hold, new_id(), slot_b, "c3", "released", None, new_id())
    with pytest.raises(asyncpg.CheckViolationError):  # a confirmed booking always names its payment
        await booking_pool.execute(insert_hold, new_id(), slot_b, "c4", "confirmed", None, new_id())


FUNCTION_FOLDERS = (SHARED_MIGRATIONS / "functions",
                    pathlib.Path(__file__).resolve().parents[3] / "services" / "booking" / "migrations" / "functions")


async def test_every_function_has_one_file_and_is_that_files_function(booking_pool):
    """Every function of the schema (extensions' aside) is defined by one file of migrations/functions
    (shared or booking's) named after it, and each such file by one function: a function created or
    redefined by a versioned migration (another signature, or another body) fails here."""
    functions = await booking_pool.fetch("""
        SELECT p.proname, p.prosrc FROM pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                            WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')""")
    files = {f.stem: f.read_text() for folder in FUNCTION_FOLDERS for f in folder.glob("*.sql")}
    assert len(files) == sum(1 for folder in FUNCTION_FOLDERS for _ in folder.glob("*.sql"))  # no name twice
    assert sorted(r["proname"] for r in functions) == sorted(files)
    for r in functions:  # the body in the database is the one in its file
        assert r["prosrc"] in files[r["proname"]], r["proname"]
