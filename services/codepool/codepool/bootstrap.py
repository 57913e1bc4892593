"""Wiring of the code pool's gRPC server (used by __main__ and by in-process integration tests)."""
from __future__ import annotations

import hmac
import logging

import asyncpg

from cuty.codepool.v1 import claims_pb2, claims_pb2_grpc, codepool_pb2, codepool_pb2_grpc
from cutylib.config import Settings, env_float, env_int
from cutylib.db import ALL_MERCHANTS, create_pool
from cutylib import retention
from cutylib.grpc_server import GrpcServer
from cutylib.metrics import LeaseLeader, refresh_periodically
from cutylib.retention import Retention

from . import claims_api, metrics
from .batches import Batches
from .catalog import Catalog
from .claims import Claims
from .grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES, CodePoolApi
from .importer import Importer
from .keys import Keyring, KeyringError
from .service import ReservationService
from .stock_events import StockEvents
from .workers import SWEEP_BATCH_DEFAULT, Sweeper

log = logging.getLogger("codepool")

SERVICE = codepool_pb2.DESCRIPTOR.services_by_name["CodePoolService"]
CLAIM_SERVICE = claims_pb2.DESCRIPTOR.services_by_name["CodeClaimService"]
# How long audit entries are kept (CUTY_AUDIT_LOG_RETENTION_DAYS; 0: forever): two years.
AUDIT_LOG_RETENTION_DAYS = 730
# The outbox of merchant events (stock_events) in week partitions, kept this long
# (CUTY_STOCK_EVENTS_RETENTION_DAYS; 0: forever): the orchestrator's relay stores each event in its
# own merchant events within seconds, so this is how long a stopped relay may stay behind before
# events it has not read leave; refused below STOCK_EVENTS_MIN_DAYS.
STOCK_EVENTS_RETENTION_DAYS = 30
STOCK_EVENTS_MIN_DAYS = 7
STOCK_EVENTS_PARTITION_DAYS = 7
STOCK_EVENTS_AHEAD = 4
# A finished order (delivered or released) moves into the order history this long after it finished
# (CUTY_RESERVATIONS_MOVE_AFTER_DAYS). Its codes may be claimed while it is live, so this is the claims
# window: refused below CLAIM_WINDOW_MIN_DAYS.
ORDERS_MOVE_AFTER_DAYS = 90
CLAIM_WINDOW_MIN_DAYS = 30
# The order history is kept this long after the move (CUTY_CODEPOOL_HISTORY_RETENTION_DAYS; 0:
# forever): two years, like the audit trail that names the same orders; refused below
# HISTORY_MIN_DAYS, the payment timeline's default retention (a year and a chargeback window), which
# a chargeback's evidence joins with the order's codes.
ORDER_HISTORY_RETENTION_DAYS = 730
HISTORY_MIN_DAYS = 400
ORDER_HISTORIES = ("reservations_history", "deliveries_history", "payment_transactions_history")
# Orders a mover transaction: each brings its deliveries and payment transaction along, and the
# deliveries' and payment transactions' foreign keys are checked per order as it leaves, so an order
# costs about three of another mover's rows: 200 keeps a batch near theirs of 500 (`make bench-growth`).
ORDERS_MOVE_BATCH = 200

RECORD_HASH_KEY = """
INSERT INTO hash_key_check (fingerprint) VALUES ($1) ON CONFLICT (singleton) DO NOTHING
"""


def codepool_retention(pool: asyncpg.Pool) -> Retention:
    """The code pool's retention job (docs/codepool.md, "Retention"): the audit log's and the outbox's
    partitions, and finished orders moved into the order history, whose partitions leave past its
    retention."""
    tables = [retention.table("audit_log", AUDIT_LOG_RETENTION_DAYS),
              retention.table("stock_events", STOCK_EVENTS_RETENTION_DAYS, width_days=STOCK_EVENTS_PARTITION_DAYS,
                              ahead=STOCK_EVENTS_AHEAD, at_least_days=STOCK_EVENTS_MIN_DAYS)] + [
        retention.table(t, ORDER_HISTORY_RETENTION_DAYS, "codepool_history", at_least_days=HISTORY_MIN_DAYS)
        for t in ORDER_HISTORIES]
    return Retention(pool, tables, retention.archive_dir(),
                     [retention.move("reservations", "reservations_move", ORDERS_MOVE_AFTER_DAYS,
                                     at_least_days=CLAIM_WINDOW_MIN_DAYS, batch=ORDERS_MOVE_BATCH)])


async def create_codepool_pool(dsn: str, settings: Settings, **overrides) -> asyncpg.Pool:
    """The code pool's own paths (the orchestrator's, customers', the workers') see every merchant;
    staff and admins are narrowed to theirs. Behind PgBouncer in transaction mode in production, so
    the merchant goes with each transaction, not at connect (docs/tenancy.md)."""
    options = dict(min_size=settings.db_pool_min, max_size=settings.db_pool_max, application_name="cuty-codepool",
                   acquire_timeout=settings.db_acquire_timeout_seconds,
                   reporting_max_size=settings.db_reporting_pool_max)
    options.update(overrides)
    return await create_pool(dsn, merchant=ALL_MERCHANTS, merchant_at_connect=False, **options)


def load_keyring(settings: Settings) -> Keyring:
    return Keyring.load(settings.code_keys, settings.data_dir)


async def check_hash_key(pool: asyncpg.Pool, keyring: Keyring) -> None:
    """Refuse to run with a hash key other than the one the stored codes were hashed under: the
    duplicate check would silently pass every duplicate."""
    await pool.execute(RECORD_HASH_KEY, keyring.hash_fingerprint())
    stored = await pool.fetchval("SELECT fingerprint FROM hash_key_check")
    if not hmac.compare_digest(bytes(stored), keyring.hash_fingerprint()):
        raise KeyringError("the configured hash key is not the one this database's codes were hashed under; "
                           "restore CUTY_CODE_HASH_KEY (or the keyring's hash key)")


async def create_server(settings: Settings, pool: asyncpg.Pool, *, port: int = 0, host: str = "127.0.0.1",
                        keyring: Keyring | None = None) -> GrpcServer:
    keyring = keyring or load_keyring(settings)
    reservations = ReservationService(pool, ttl_seconds=settings.code_reservation_ttl_seconds,
                                      max_active=settings.max_active_reservations,
                                      max_quantity=settings.max_quantity_per_product)
    stock_events = StockEvents(pool)
    catalog = Catalog(pool, keyring)
    api = CodePoolApi(reservations, catalog,
                      Importer(pool, keyring, chunk_rows=env_int("CUTY_CODE_IMPORT_CHUNK", 5000),
                               concurrency=env_int("CUTY_CODE_IMPORT_CONCURRENCY", 4),
                               idle_seconds=env_float("CUTY_CODE_IMPORT_IDLE_SECONDS", 30),
                               slot_wait_seconds=settings.db_acquire_timeout_seconds),
                      stock_events)
    server = GrpcServer("codepool", port, host=host)
    codepool_pb2_grpc.add_CodePoolServiceServicer_to_server(api, server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    # After the sale: claims on delivered codes, supplier batches held back (docs/codepool.md).
    claims_pb2_grpc.add_CodeClaimServiceServicer_to_server(
        claims_api.CodeClaimApi(Claims(pool), Batches(pool, catalog)), server.server)
    server.add_service(CLAIM_SERVICE, claims_api.CALLERS, system=claims_api.SYSTEM_RPCS, roles=claims_api.USER_ROLES)
    # Before serving, once the database answers (it may be away when the process starts).
    server.on_database_ready(lambda: check_hash_key(pool, keyring))
    sweeper = Sweeper(reservations, settings.sweep_interval_seconds,
                      batch=env_int("CUTY_CODE_SWEEP_BATCH", SWEEP_BATCH_DEFAULT))
    server.add_background(sweeper.run)
    server.add_background(stock_events.run_recheck)
    # The stock gauges are the database's numbers: one replica exports them. A lease row, not an
    # advisory lock, elects it: in Kubernetes the pool goes through PgBouncer in transaction mode.
    server.add_background(lambda: refresh_periodically(lambda: metrics.REGISTRY.refresh_stock(pool),
                                                       leader=LeaseLeader(pool, "codepool"), metrics=metrics.REGISTRY))
    # The audit log's and the order history's partitions: made ahead, detached (and archived) past
    # their retention; finished orders moved into the history first.
    server.add_background(codepool_retention(pool).run)
    server.sweeper = sweeper  # type: ignore[attr-defined] - tests read its counters
    server.api = api  # type: ignore[attr-defined] - tests drive RPCs no service calls through its use cases
    log.info("code pool wired", extra={"keys": sorted(keyring.keys), "active_key": keyring.active,
                                       "reservation_ttl_seconds": settings.code_reservation_ttl_seconds})
    return server
