"""Wiring shared by __main__ and the in-process integration tests."""
from __future__ import annotations

import inspect

import asyncpg

from cuty.payments.v1 import payments_pb2, payments_pb2_grpc
from cutylib import retention
from cutylib.config import Settings
from cutylib.db import ALL_MERCHANTS, create_pool
from cutylib.grpc_server import GrpcServer
from cutylib.metrics import MetricsLeader, refresh_periodically
from cutylib.retention import Retention

from . import audit, signature
from .checkout import wiring
from .checkout.settings import CheckoutOptions
from .claims import wiring as claims
from .disputes import wiring as disputes
from .outbound import wiring as outbound
from .service import PaymentsCore
from .grpc_api import CALLERS, SYSTEM_RPCS, USER_ROLES, PaymentApi
from .psp import PspClient
from .reconcile import Reconciler
from .settings import PaymentsOptions
from .webhooks import WebhookInbox

SERVICE = payments_pb2.DESCRIPTOR.services_by_name["PaymentService"]
# How long the payment timeline is kept (CUTY_PAYMENT_EVENTS_RETENTION_DAYS; 0: forever): 400 days,
# a year of sales and the month after it in which a chargeback may still ask about one.
PAYMENT_EVENTS_RETENTION_DAYS = 400


async def create_payments_pool(dsn: str, settings: Settings) -> asyncpg.Pool:
    # max_inactive_connection_lifetime=0: no idle timer re-armed on every release (several per
    # checkout); a service pool of a few dozen connections has nothing to gain from closing idle ones.
    # The saga, customers' and the workers' paths see every merchant, declared once per session (a
    # direct connection: LISTEN needs one); staff and admins are narrowed to theirs (docs/tenancy.md).
    return await create_pool(dsn, min_size=settings.db_pool_min, max_size=settings.db_pool_max,
                             application_name="cuty-payments", merchant=ALL_MERCHANTS, max_inactive_connection_lifetime=0,
                             acquire_timeout=settings.db_acquire_timeout_seconds,
                             reporting_max_size=settings.db_reporting_pool_max)


# Outbound events move into their histories 30 days after their deliveries finished
# (CUTY_MERCHANT_EVENTS_MOVE_AFTER_DAYS: a merchant redelivers a failed one until then), and the
# histories are kept 400 days (CUTY_OUTBOUND_HISTORY_RETENTION_DAYS; 0: forever).
MERCHANT_EVENTS_MOVE_AFTER_DAYS = 30
OUTBOUND_HISTORY_RETENTION_DAYS = 400
OUTBOUND_HISTORIES = ("merchant_events_history", "webhook_deliveries_history", "webhook_attempts_history")
# The checkout API's Idempotency-Keys live a day (CUTY_IDEMPOTENCY_TTL_SECONDS) in day partitions,
# made 3 days ahead, and leave whole 2 days after their day (CUTY_CHECKOUT_IDEMPOTENCY_KEYS_RETENTION_DAYS,
# never below the keys' lifetime): a dead key's row stays at most 3 days.
IDEMPOTENCY_KEYS_RETENTION_DAYS = 2
IDEMPOTENCY_KEYS_PARTITION_DAYS = 1
IDEMPOTENCY_KEYS_AHEAD = 3
# The PSP's webhook events, deduplicated on their ids, in week partitions (4 made ahead), kept 30
# days after their week (CUTY_PSP_EVENT_RETENTION_DAYS): a redelivery comes within minutes (older
# ones fail the signature's tolerance), and the on-call story reads a payment's events for a month.
PSP_EVENTS_RETENTION_DAYS = 30
PSP_EVENTS_PARTITION_DAYS = 7
PSP_EVENTS_AHEAD = 4


def payments_retention(pool: asyncpg.Pool) -> Retention:
    """Payments' retention job: the timeline's partitions, finished outbound events moved into
    their histories and the histories' partitions, the idempotency keys' and PSP events' partitions."""
    tables = [retention.table("payment_events", PAYMENT_EVENTS_RETENTION_DAYS)]
    tables += [retention.table(t, OUTBOUND_HISTORY_RETENTION_DAYS, "outbound_history") for t in OUTBOUND_HISTORIES]
    tables.append(retention.table(
        "checkout_idempotency_keys", IDEMPOTENCY_KEYS_RETENTION_DAYS, width_days=IDEMPOTENCY_KEYS_PARTITION_DAYS,
        ahead=IDEMPOTENCY_KEYS_AHEAD, at_least_days=CheckoutOptions().idempotency_ttl_seconds / 86400))
    tables.append(retention.table("psp_events", PSP_EVENTS_RETENTION_DAYS, "psp_event", width_days=PSP_EVENTS_PARTITION_DAYS,
                                  ahead=PSP_EVENTS_AHEAD, at_least_days=1))
    return Retention(pool, tables, retention.archive_dir(),
                     [retention.move("merchant_events", "merchant_events_move", MERCHANT_EVENTS_MOVE_AFTER_DAYS)])


def build_core(settings: Settings, pool: asyncpg.Pool, *, psp=None,
               options: PaymentsOptions | None = None) -> PaymentsCore:
    options = options or PaymentsOptions()
    psp = psp or PspClient(settings.psp_url, timeout=options.psp_timeout_seconds, retries=options.psp_retries,
                           backoff=options.psp_backoff_seconds)
    return PaymentsCore(settings, pool, psp, options=options)


async def create_server(settings: Settings, pool: asyncpg.Pool, *, port: int = 0, host: str = "127.0.0.1",
                        psp=None, options: PaymentsOptions | None = None, workers: bool = True) -> GrpcServer:
    """A payments GrpcServer (not started): PaymentService, the webhook-retry worker, the reconciler,
    and the checkout saga (payments.checkout.wiring). `psp`: a PSP client (default: HTTP to
    CUTY_PSP_URL, closed on stop). `workers=False` leaves the background workers out."""
    core = build_core(settings, pool, psp=psp, options=options)
    inbox = WebhookInbox(core, signature.secrets_from(settings.psp_webhook_secret,
                                                      settings.psp_webhook_previous_secrets))
    server = GrpcServer("payments", port, host=host)
    payments_pb2_grpc.add_PaymentServiceServicer_to_server(PaymentApi(core, inbox), server.server)
    server.add_service(SERVICE, CALLERS, system=SYSTEM_RPCS, roles=USER_ROLES)
    if workers:
        server.add_background(inbox.run_retries)
        server.add_background(Reconciler(core).run)
        # The timeline's, the outbound histories', the idempotency keys' and the PSP events'
        # partitions: made ahead, detached (and archived) past their retention; finished outbound
        # events moved into their histories first.
        server.add_background(payments_retention(pool).run)
        # One replica (the advisory-lock leader) exports the gauges read from the database.
        server.add_background(lambda: refresh_periodically(
            lambda: core.metrics.refresh(pool, settings.reconcile_after_seconds),
            leader=MetricsLeader(pool, "payments"), metrics=core.metrics))
    if psp is None:
        server.on_stop(core.psp.aclose)
    # Merchants' webhook endpoints and the delivery workers of the outbox.
    outbound.register(server, settings, pool, core.worker_id, workers=workers)
    # Claims on delivered codes: an admin's resolution (replace, refund, reject) and its finisher.
    claims.register(server, pool, core, workers=workers)
    # Disputes of captured payments: recorded from the PSP's webhooks, evidence submitted in time.
    disputes.register(server, pool, core, inbox, workers=workers)
    if workers:
        # The standing proof that payments, booking, the code pool and the PSP agree (payments/audit.py).
        audit.register(server, pool, core)
    registered = wiring.register(server, settings, pool, core)
    if inspect.isawaitable(registered):
        await registered
    return server
