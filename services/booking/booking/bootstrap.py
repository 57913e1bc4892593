"""Wiring shared by __main__ and the in-process integration tests."""
from __future__ import annotations

import asyncpg

from cuty.booking.v1 import booking_pb2, booking_pb2_grpc
from cutylib.config import Settings
from cutylib.db import ALL_MERCHANTS, create_pool
from cutylib.grpc_server import GrpcServer
from cutylib.listen import listen
from cutylib import retention
from cutylib.retention import Retention

from . import taken
from .grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES, BookingApi
from .service import BookingService, ScheduleService
from .workers import Sweeper

SERVICE = booking_pb2.DESCRIPTOR.services_by_name["BookingService"]

# Finished holds move into holds_history a week after they finished (CUTY_HOLDS_MOVE_AFTER_DAYS: a
# retried HoldSlot or a late ConfirmHold finds them live until then), and the history is kept 400
# days (CUTY_HOLDS_HISTORY_RETENTION_DAYS; 0: forever), like the payment timeline it goes with.
HOLDS_MOVE_AFTER_DAYS = 7
HOLDS_HISTORY_RETENTION_DAYS = 400


def holds_retention(pool: asyncpg.Pool) -> Retention:
    """Booking's retention job: finished holds moved into their history, its partitions kept."""
    return Retention(pool, [retention.table("holds_history", HOLDS_HISTORY_RETENTION_DAYS)],
                     retention.archive_dir(), [retention.move("holds", "holds_move", HOLDS_MOVE_AFTER_DAYS)])


async def create_booking_pool(dsn: str, settings: Settings) -> asyncpg.Pool:
    # max_inactive_connection_lifetime=0: no idle timer re-armed on every release; a service pool
    # of a few connections has nothing to gain from closing idle ones. Booking's own paths (the
    # orchestrator's, customers') see every merchant; staff and admins are narrowed to theirs. It
    # reaches its database through PgBouncer in transaction mode in production, so the merchant is
    # sent per transaction, not at connect (docs/tenancy.md).
    return await create_pool(dsn, min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                             application_name="cuty-booking", merchant=ALL_MERCHANTS, merchant_at_connect=False,
                             max_inactive_connection_lifetime=0,
                             acquire_timeout=settings.db_acquire_timeout_seconds,
                             reporting_max_size=settings.db_reporting_pool_max)


async def create_server(settings: Settings, pool: asyncpg.Pool, *, port: int = 0, host: str = "127.0.0.1",
                        sweeper: bool = True) -> GrpcServer:
    """A booking GrpcServer (not started): the service, its health/reflection name, the sweeper.

    `sweeper=False` leaves the background sweeper out (tests that drive `Sweeper.sweep_once`
    themselves, or prove that nothing depends on it).
    """
    server = GrpcServer("booking", port, host=host)
    service = BookingService(pool, settings)
    booking_pb2_grpc.add_BookingServiceServicer_to_server(BookingApi(service, ScheduleService(pool)), server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    server.add_background(lambda: listen(pool, taken.NOTIFY_CHANNEL, service.taken.freed,
                                         on_listening=service.taken.listening))
    if sweeper:
        server.add_background(Sweeper(pool, settings.sweep_interval_seconds).run)
        server.add_background(holds_retention(pool).run)
    return server
