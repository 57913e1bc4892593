"""Booking over real gRPC (in-process server, port 0, a real channel) on the session's Postgres.

Every test builds its own salon and resources with fresh ids, so tests never see each other's holds.
"""
from __future__ import annotations

import dataclasses

import pytest_asyncio

from booking.bootstrap import create_booking_pool, create_server
from booking_harness import Booking
from cuty.booking.v1 import booking_pb2_grpc
from cutylib.config import Settings
from booking.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel


async def _start(pool, **overrides) -> tuple:
    settings = dataclasses.replace(Settings(), sweep_interval_seconds=3600, **overrides)
    server = await create_server(settings, pool, port=0, host="127.0.0.1", sweeper=False)
    await server.start()
    channel = acting_channel(f"127.0.0.1:{server.port}", "booking", CALLERS, deadline_seconds=20)
    return server, channel, Booking(server, booking_pb2_grpc.BookingServiceStub(channel), settings)


@pytest_asyncio.fixture(scope="session")
async def booking_pool(booking_service_dsn):
    p = await create_booking_pool(booking_service_dsn, dataclasses.replace(Settings(), db_pool_min=2, db_pool_max=20))
    yield p
    await p.close()


@pytest_asyncio.fixture(scope="session")
async def booking(booking_pool):
    server, channel, b = await _start(booking_pool)
    yield b
    await channel.close()
    await server.stop()


@pytest_asyncio.fixture(scope="session")
async def short_booking(booking_pool):
    """Holds that expire after 1 s, to watch expiry happen."""
    server, channel, b = await _start(booking_pool, hold_ttl_seconds=1)
    yield b
    await channel.close()
    await server.stop()
