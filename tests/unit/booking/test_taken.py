"""What booking remembers of blocked slots can only ever say "taken" while that is known true."""
import uuid
from datetime import datetime, timedelta, timezone

from booking.taken import Blocked, TakenSlots

NOW = datetime(2026, 12, 5, 18, tzinfo=timezone.utc)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def cache(**kw):
    clock = Clock()
    t = TakenSlots(clock=clock, alternatives_fresh=1.0, max_age=60.0, **kw)
    t.listening(True)
    return t, clock


def blocked(resource=None, holders=("winner",), seconds: float | None = 300) -> Blocked:
    until = None if seconds is None else NOW + timedelta(seconds=seconds)
    return Blocked(resource or uuid.uuid4(), frozenset(holders), until, NOW)


def fill(t: TakenSlots, slot, b: Blocked, alternatives=("alt",)) -> bool:
    return t.remember(slot, b, list(alternatives), t.start_filling(slot))


def test_a_loser_is_answered_from_memory_while_the_alternatives_are_fresh():
    t, clock = cache()
    slot = uuid.uuid4()
    assert t.answer(slot, "loser") is None  # nothing known: the database decides
    assert fill(t, slot, blocked())
    assert t.answer(slot, "loser") == ("alt",)
    clock.t += 1.0
    assert t.answer(slot, "loser") is None  # alternatives a second old: the next loser refreshes them


def test_never_past_the_blocking_holds_expiry_nor_the_maximum_age():
    t, clock = cache()
    short, booked = uuid.uuid4(), uuid.uuid4()
    fill(t, short, blocked(seconds=0.5))
    fill(t, booked, blocked(seconds=None))  # a confirmed booking
    clock.t += 0.6
    assert t.answer(short, "loser") is None and len(t) == 1  # the hold expired: forgotten
    assert fill(t, booked, blocked(seconds=None))
    clock.t += 60
    assert t.answer(booked, "loser") is None


def test_the_holder_always_asks_the_database():
    t, _ = cache()
    slot = uuid.uuid4()
    fill(t, slot, blocked(holders=("winner",)))
    assert t.answer(slot, "winner") is None  # their retry must find their own hold
    assert t.answer(slot, "someone else") == ("alt",)


def test_a_freed_resource_forgets_its_slots_only():
    t, _ = cache()
    r1, r2 = uuid.uuid4(), uuid.uuid4()
    a, b = uuid.uuid4(), uuid.uuid4()
    fill(t, a, blocked(resource=r1))
    fill(t, b, blocked(resource=r2))
    t.freed(str(r1))
    assert t.answer(a, "loser") is None
    assert t.answer(b, "loser") == ("alt",)


def test_a_notification_during_a_fill_discards_it():
    t, _ = cache()
    slot = uuid.uuid4()
    generation = t.start_filling(slot)
    t.freed(str(uuid.uuid4()))  # any resource: it may be the one that blocked this slot
    assert not t.remember(slot, blocked(), ["alt"], generation)
    assert t.answer(slot, "loser") is None


def test_one_fill_per_slot_at_a_time():
    t, _ = cache()
    slot = uuid.uuid4()
    g = t.start_filling(slot)
    assert g is not None and t.start_filling(slot) is None  # a thousand losers ask once
    t.remember(slot, None, [], g)  # nothing blocks it any more: nothing kept, the fill ends
    assert t.start_filling(slot) is not None


def test_not_listening_means_not_answering():
    t, _ = cache()
    slot = uuid.uuid4()
    fill(t, slot, blocked())
    t.listening(False)  # the listener lost its connection: a NOTIFY may be missed
    assert t.answer(slot, "loser") is None and len(t) == 0
    assert t.start_filling(slot) is None
    t.listening(True)
    assert t.answer(slot, "loser") is None  # nothing survives the gap


def test_bounded():
    t, _ = cache(max_entries=3)
    slots = [uuid.uuid4() for _ in range(5)]
    for s in slots:
        fill(t, s, blocked())
    assert len(t) == 3
    assert t.answer(slots[0], "loser") is None and t.answer(slots[-1], "loser") == ("alt",)
