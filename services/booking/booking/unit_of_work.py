"""Booking's unit of work: one transaction, its repositories bound to it, rolled back unless committed."""
from __future__ import annotations

from datetime import datetime

from cutylib.db import UnitOfWork

from .repository import Holds, Resources, Salons, Slots


class BookingUnitOfWork(UnitOfWork):
    """`async with BookingUnitOfWork(pool) as uow: ... await uow.commit()`; leaving without
    `commit()` (an early return, an exception) rolls everything back (cutylib.db.UnitOfWork)."""

    salons: Salons
    resources: Resources
    slots: Slots
    holds: Holds

    async def __aenter__(self) -> "BookingUnitOfWork":
        await super().__aenter__()
        self.salons = Salons(self.conn)
        self.resources = Resources(self.conn)
        self.slots = Slots(self.conn)
        self.holds = Holds(self.conn)
        return self

    async def now(self) -> datetime:
        """The database clock, the only clock booking decisions use (DESIGN.md, "Time")."""
        return await self.conn.fetchval("SELECT clock_timestamp()")
