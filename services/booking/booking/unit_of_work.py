"""Booking's unit of work: one transaction, its repositories bound to it, rolled back unless committed."""
from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import datetime
from typing import AsyncIterator

import asyncpg

from cutylib import tenancy
from cutylib.db import UnitOfWork
from cutylib.principal import Principal

from .repository import Holds, Resources, Salons, Slots
from .schedule_repository import Schedule


class BookingUnitOfWork(UnitOfWork):
    """`async with BookingUnitOfWork(pool) as uow: ... await uow.commit()`; leaving without
    `commit()` (an early return, an exception) rolls everything back (cutylib.db.UnitOfWork)."""

    salons: Salons
    resources: Resources
    slots: Slots
    holds: Holds
    schedule: Schedule

    async def __aenter__(self) -> "BookingUnitOfWork":
        await super().__aenter__()
        _bind(self)
        return self

    async def now(self) -> datetime:
        return await db_now(self.conn)


async def db_now(conn: asyncpg.Connection) -> datetime:
    """The database clock, the only clock booking decisions use (docs/architecture.md, "Time")."""
    return await conn.fetchval("SELECT clock_timestamp()")


def _bind(uow: UnitOfWork) -> None:
    uow.salons = Salons(uow.conn)
    uow.resources = Resources(uow.conn)
    uow.slots = Slots(uow.conn)
    uow.holds = Holds(uow.conn)
    uow.schedule = Schedule(uow.conn)


@asynccontextmanager
async def scoped(pool: asyncpg.Pool, caller: Principal) -> AsyncIterator[UnitOfWork]:
    """A unit of work (with booking's repositories) that sees only the caller's merchant's rows:
    cutylib.tenancy.scoped, i.e. SET LOCAL cuty.merchant for staff and admins (Row-Level
    Security), unchanged for everyone else. The queries filter by the merchant themselves too."""
    async with tenancy.scoped(pool, caller) as uow:
        _bind(uow)
        yield uow
