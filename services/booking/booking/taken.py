"""The losers of a hot slot answered from memory.

When a thousand buyers race for one Saturday 18:00, one wins and the rest lose; each loser used to
cost a database round trip and a fresh search for alternatives. Once a loser learned that a slot is
blocked, and until when, booking answers the next losers of that slot without the database, with
the same alternatives.

It can only ever say that a slot is taken; whether a slot is sold is decided by the database alone
(booking_take_hold). A wrong "taken" is what must not happen, so an entry lives only while it is
known true:
- until the blocking holds' latest expiry (a confirmed booking: at most MAX_AGE);
- until a hold of the slot's resource is released, expires or is cancelled: the database sends
  NOTIFY booking_time_freed (resource id) at that commit, and the entries of that resource go;
- only while this replica is listening: a listener that lost its connection may have missed a
  NOTIFY, so the cache is emptied and unused until it listens again;
- an entry filled while a NOTIFY arrived is not kept (the notification may concern it);
- the alternatives are at most ALTERNATIVES_FRESH old: after that the next loser takes the
  database path, which refreshes them. So whatever fails (a notification lost before the listener
  noticed its connection was gone), a freed time is seen as free within ALTERNATIVES_FRESH.
A replica that frees a time itself (ReleaseHold, CancelBooking) forgets it at once; the others
within the NOTIFY's delivery (milliseconds), as if that loser had been a moment earlier.
A customer who holds the time themselves always takes the database path (their retry must find
their own hold). Bounded: at most MAX_ENTRIES slots, the oldest dropped first.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from .domain import Slot

MAX_ENTRIES = 10_000
MAX_AGE = 60.0
ALTERNATIVES_FRESH = 1.0
NOTIFY_CHANNEL = "booking_time_freed"


@dataclass(frozen=True)
class Blocked:
    """What blocks a slot, as the database said: its resource, the customers holding the time, and
    until when (None: a confirmed booking, blocked until cancelled)."""
    resource_id: uuid.UUID
    holders: frozenset[str]
    until: datetime | None
    db_now: datetime


@dataclass(frozen=True)
class _Entry:
    resource_id: uuid.UUID
    holders: frozenset[str]
    until: float           # monotonic
    filled_at: float       # monotonic
    alternatives: tuple[Slot, ...]


class TakenSlots:
    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_age: float = MAX_AGE,
                 alternatives_fresh: float = ALTERNATIVES_FRESH, clock=time.monotonic):
        self.max_entries = max_entries
        self.max_age = max_age
        self.alternatives_fresh = alternatives_fresh
        self._clock = clock
        self._entries: dict[uuid.UUID, _Entry] = {}
        self._listening = False
        self._generation = 0  # counts notifications and listener changes
        self._filling: set[uuid.UUID] = set()

    # The listener (cutylib.listen) -------------------------------------------------------------
    def listening(self, up: bool) -> None:
        self._entries.clear()
        self._generation += 1
        self._listening = up

    def freed(self, payload: str) -> None:
        """NOTIFY booking_time_freed: a hold of resource `payload` stopped blocking its time."""
        self._generation += 1
        for slot_id in [s for s, e in self._entries.items() if str(e.resource_id) == payload]:
            del self._entries[slot_id]

    # The hold path ------------------------------------------------------------------------------
    def answer(self, slot_id: uuid.UUID, customer_id: str) -> tuple[Slot, ...] | None:
        """The alternatives to offer a loser of `slot_id`, or None: ask the database."""
        e = self._entries.get(slot_id)
        if e is None or not self._listening:
            return None
        now = self._clock()
        if now >= e.until:
            del self._entries[slot_id]
            return None
        if now - e.filled_at >= self.alternatives_fresh or customer_id in e.holders:
            return None
        return e.alternatives

    def start_filling(self, slot_id: uuid.UUID) -> int | None:
        """Before a loser asks the database what blocks `slot_id`: the generation to hand back to
        remember(), or None when there is no use asking (not listening, or another loser of the same
        slot is asking right now: a thousand losers at once ask once)."""
        if not self._listening or slot_id in self._filling or len(self._filling) >= self.max_entries:
            return None
        self._filling.add(slot_id)
        return self._generation

    def remember(self, slot_id: uuid.UUID, blocked: Blocked | None, alternatives: list[Slot], generation: int) -> bool:
        """Keep what a loser was told, unless something may have changed since `generation`
        (start_filling's); ends the fill either way."""
        self._filling.discard(slot_id)
        if blocked is None or not self._listening or generation != self._generation:
            return False
        now = self._clock()
        life = self.max_age if blocked.until is None else (blocked.until - blocked.db_now).total_seconds()
        if life <= 0:
            return False
        self._entries.pop(slot_id, None)
        if len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]  # the oldest filled
        self._entries[slot_id] = _Entry(blocked.resource_id, blocked.holders, now + min(life, self.max_age), now,
                                        tuple(alternatives))
        return True

    def __len__(self) -> int:
        return len(self._entries)
