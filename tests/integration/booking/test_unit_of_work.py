"""Booking's unit of work writes only what a use case commits."""
import pytest

from booking.unit_of_work import BookingUnitOfWork
from cutylib.testing.ids import new_id
from cutylib.testing.trust import TEST_MERCHANT


async def _count(pool, name: str) -> int:
    return await pool.fetchval("SELECT count(*) FROM salons WHERE name = $1", name)


async def test_rolls_back_unless_committed(booking_pool):
    left, failed, kept = (f"salon {new_id()}" for _ in range(3))
    async with BookingUnitOfWork(booking_pool) as uow:
        salon = await uow.salons.add(TEST_MERCHANT, left, "Europe/Istanbul")
        await uow.resources.add(salon.id, "chair", TEST_MERCHANT)
        assert await uow.salons.get(salon.id, TEST_MERCHANT) == salon  # visible inside its own transaction
    with pytest.raises(RuntimeError):
        async with BookingUnitOfWork(booking_pool) as uow:
            await uow.salons.add(TEST_MERCHANT, failed, "Europe/Istanbul")
            raise RuntimeError("use case failed half-way")
    async with BookingUnitOfWork(booking_pool) as uow:
        await uow.salons.add(TEST_MERCHANT, kept, "Europe/Istanbul")
        await uow.commit()
    assert (await _count(booking_pool, left), await _count(booking_pool, failed), await _count(booking_pool, kept)) == (0, 0, 1)
    assert await booking_pool.fetchval(
        "SELECT count(*) FROM resources r JOIN salons s ON s.id = r.salon_id WHERE s.name = $1", left) == 0


async def test_uses_the_database_clock(booking_pool):
    async with BookingUnitOfWork(booking_pool) as uow:
        a = await uow.now()
        b = await uow.now()
    assert a.tzinfo is not None and b > a  # clock_timestamp(), not the frozen transaction start
