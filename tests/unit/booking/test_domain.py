"""Booking's pure rules, without I/O."""
import uuid
from datetime import date, datetime, time, timedelta, timezone

import pytest

from booking import domain
from cutylib.errors import InvalidArgument, PermissionDenied, Unauthenticated
from cutylib.fields import parse_uuid
from cutylib.principal import SYSTEM, Principal

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
NY = "America/New_York"


def _field(exc_info) -> str:
    return exc_info.value.field


def test_a_held_hold_past_its_expiry_reads_expired():
    assert domain.effective_status("held", NOW + timedelta(seconds=1), NOW) == "held"
    assert domain.effective_status("held", NOW, NOW) == "expired"
    assert domain.effective_status("confirmed", NOW - timedelta(days=1), NOW) == "confirmed"
    assert domain.effective_status("released", NOW + timedelta(days=1), NOW) == "released"


@pytest.mark.parametrize("value", ["", "abc", "8f14e45fceea467fa0e66f3a2a1b9c4d", "{8f14e45f-ceea-467f-a0e6-6f3a2a1b9c4d}",
                                   "8f14e45f-ceea-467f-a0e6-6f3a2a1b9c4", " 8f14e45f-ceea-467f-a0e6-6f3a2a1b9c4d"])
def test_ids_must_be_canonical_uuids(value):
    with pytest.raises(InvalidArgument) as e:
        parse_uuid("slot_id", value)
    assert _field(e) == "slot_id"


def test_ids_parse():
    u = uuid.uuid4()
    assert parse_uuid("x", str(u)) == u
    assert parse_uuid("x", str(u).upper()) == u


def test_names_are_trimmed_and_bounded():
    assert domain.require_name("name", "  Kuaför Ayşe ") == "Kuaför Ayşe"
    for bad in ("", "  \t", "x" * 201):
        with pytest.raises(InvalidArgument):
            domain.require_name("name", bad)


@pytest.mark.parametrize("tz", ["Europe/Istanbul", "America/New_York", "UTC", "Asia/Kolkata"])
def test_iana_zones_pass(tz):
    assert domain.require_time_zone("time_zone", tz) == tz


@pytest.mark.parametrize("tz", ["", "+03", "UTC+3", "Europe/Atlantis", "localtime", "posixrules", "europe/istanbul"])
def test_other_zones_fail(tz):
    with pytest.raises(InvalidArgument) as e:
        domain.require_time_zone("time_zone", tz)
    assert _field(e) == "time_zone"


def test_money():
    assert domain.require_money("price", "TRY", 0) == ("TRY", 0)
    cases = [(None, None, "price"), ("XYZ", 1, "price.currency_code"), ("try", 1, "price.currency_code"),
             ("XAU", 1, "price.currency_code"), ("EUR", -1, "price.amount_minor")]
    for currency, amount, field in cases:
        with pytest.raises(InvalidArgument) as e:
            domain.require_money("price", currency, amount)
        assert _field(e) == field


def test_instants_need_an_offset_and_come_out_in_utc():
    with pytest.raises(InvalidArgument) as e:
        domain.require_instant("start_time", datetime(2026, 6, 1, 9, 0))
    assert _field(e) == "start_time"
    with pytest.raises(InvalidArgument):
        domain.require_instant("start_time", None)
    istanbul = datetime(2026, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=3)))
    assert domain.require_instant("start_time", istanbul) == datetime(2026, 6, 1, 9, 0, tzinfo=timezone.utc)


def _draft(i=0, start=NOW + timedelta(days=1), minutes=60, resource=None):
    return domain.slot_draft(i, str(resource or uuid.uuid4()), start, start + timedelta(minutes=minutes), "TRY", 100)


def test_slot_draft_checks_end_after_start():
    with pytest.raises(InvalidArgument) as e:
        _draft(2, minutes=0)
    assert _field(e) == "slots[2].end_time"


@pytest.mark.parametrize("currency, top", [
    ("EUR", 100_000_000),            # 1,000,000.00 EUR
    ("TRY", 10_000_000_000),         # 100,000,000.00 TRY: a lira is worth about a fiftieth of a euro
    ("JPY", 100_000_000),            # 100,000,000 yen: no minor unit, a yen about a 175th of a euro
    ("KWD", 1_000_000_000),          # 1,000,000.000 KWD: three decimals
    ("IDR", 1_000_000_000_000),      # 10,000,000,000.00 IDR: 10^8 minor units would be about 52 EUR
])
def test_a_slot_price_has_an_upper_bound_per_currency_named_in_the_error(currency, top):
    """The bound is about a million euros' worth in every currency: minor units (JPY has none,
    KWD three) and the value of a unit (IDR, TRY) differ, so one number of minor units for all
    would refuse a real price in one currency and allow an absurd one in another."""
    start = NOW + timedelta(days=1)
    assert domain.max_slot_price_minor(currency) == top
    ok = domain.slot_draft(0, str(uuid.uuid4()), start, start + timedelta(hours=1), currency, top)
    assert ok.price_minor == top
    for price in (top + 1, 2**63 - 1):
        with pytest.raises(InvalidArgument) as e:
            domain.slot_draft(3, str(uuid.uuid4()), start, start + timedelta(hours=1), currency, price)
        assert _field(e) == "slots[3].price.amount_minor" and f"at most {top} " in str(e.value)
        assert currency in str(e.value)


def test_every_accepted_currency_has_a_minor_unit_and_a_bound():
    from cutylib import money
    assert set(money.MINOR_UNITS) | set(money.VALUE_MAGNITUDE) <= money.ISO_4217
    for c in money.ISO_4217:
        assert 10**7 <= domain.max_slot_price_minor(c) <= 10**14, c


def test_slot_batch_rules():
    r = uuid.uuid4()
    ok = [_draft(0, resource=r), _draft(1, start=NOW + timedelta(days=1, hours=1), resource=r)]
    domain.check_slot_batch(ok, NOW)
    for drafts, field in [
        ([], "slots"),
        ([_draft(0)] * (domain.MAX_BATCH + 1), "slots"),
        ([ok[0], _draft(1, start=NOW - timedelta(minutes=1))], "slots[1].start_time"),
        ([ok[0], _draft(1, start=NOW)], "slots[1].start_time"),
        ([ok[0], _draft(1, resource=r)], "slots[1]"),
    ]:
        with pytest.raises(InvalidArgument) as e:
            domain.check_slot_batch(drafts, NOW)
        assert _field(e) == field


def test_list_window():
    domain.check_window(NOW, NOW + timedelta(days=93))
    for end in (NOW, NOW - timedelta(seconds=1), NOW + timedelta(days=94)):
        with pytest.raises(InvalidArgument) as e:
            domain.check_window(NOW, end)
        assert _field(e) == "end_time"


def test_extension_length():
    assert domain.extension_seconds(0, 300) == 300
    assert domain.extension_seconds(1, 300) == 1
    assert domain.extension_seconds(300, 300) == 300
    for bad in (-1, 301):
        with pytest.raises(InvalidArgument) as e:
            domain.extension_seconds(bad, 300)
        assert _field(e) == "seconds"


def test_only_admins_and_internal_callers_run_admin_calls():
    domain.require_admin(Principal("u", "admin", "m-1"))
    domain.require_admin(SYSTEM)
    for p in (Principal("u", "customer"), Principal("u", "staff", "m-1"), Principal("u", "operator")):
        with pytest.raises(PermissionDenied):
            domain.require_admin(p)
    for role in ("staff", "admin"):  # a merchant's user without its merchant (the token's org)
        with pytest.raises(Unauthenticated):
            domain.require_admin(Principal("u", role))


def test_local_time_carries_the_offset_of_that_instant():
    assert domain.local_time(datetime(2027, 3, 14, 7, 0, tzinfo=timezone.utc), NY) == "2027-03-14T03:00:00-04:00"
    assert domain.local_time(datetime(2027, 3, 14, 6, 59, tzinfo=timezone.utc), NY) == "2027-03-14T01:59:00-05:00"
    assert domain.local_time(datetime(2026, 6, 1, 9, 0, tzinfo=timezone.utc), "Europe/Istanbul") == "2026-06-01T12:00:00+03:00"


def test_wall_clock_skips_the_spring_gap():
    starts = domain.wall_clock_starts(NY, date(2027, 3, 14), time(1, 0), time(4, 0), timedelta(minutes=30))
    local = [domain.local_time(s, NY)[11:] for s in starts]
    assert local == ["01:00:00-05:00", "01:30:00-05:00", "03:00:00-04:00", "03:30:00-04:00"]


def test_wall_clock_keeps_both_fall_back_instants():
    starts = domain.wall_clock_starts(NY, date(2027, 11, 7), time(1, 0), time(2, 30), timedelta(minutes=30))
    assert [s.strftime("%H:%M") for s in starts] == ["05:00", "05:30", "06:00", "06:30", "07:00"]  # UTC
    local = [domain.local_time(s, NY)[11:] for s in starts]
    assert local == ["01:00:00-04:00", "01:30:00-04:00", "01:00:00-05:00", "01:30:00-05:00", "02:00:00-05:00"]


def test_wall_clock_on_an_ordinary_day_is_one_instant_per_step():
    starts = domain.wall_clock_starts("Europe/Istanbul", date(2026, 6, 1), time(9), time(12), timedelta(hours=1))
    assert [s.hour for s in starts] == [6, 7, 8]
