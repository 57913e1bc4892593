"""WebhookEndpointService's use cases: validation, the per-endpoint secret, merchant scoping.

Admins of a merchant only (the gateway lets no other role through; this checks again): the
endpoints are the merchant's integration, so the platform's operator does not read them (no
cross-merchant read, so nothing to audit; docs/webhooks-out.md). Another merchant's endpoint or
delivery is NOT_FOUND.
"""
from __future__ import annotations

import secrets
import urllib.parse
import uuid

from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from cutylib import paging, tenancy
from cutylib.config import env_int
from cutylib.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from cutylib.fields import canonical_uuid
from cutylib.principal import Principal

from .egress import PRODUCTION_PORTS, Egress, parse_ip, refusal, refused_name
from .metrics import RedeliveryMetrics, process_redelivery_metrics
from .repository import Delivery, Endpoint, Endpoints

# What the outbox produces today (trigger checkouts_merchant_events, migrations/functions/
# checkouts_merchant_events.sql; and `stock.low`, relayed from the code pool's outbox, relay.py).
EVENT_TYPES = ("checkout.completed", "booking.confirmed", "codes.delivered", "checkout.refunded",
               "booking.cancelled", "booking.rescheduled", "stock.low", "booking.created_by_staff",
               "booking.paid_at_venue", "booking.no_show", "booking.no_show_fee_charged",
               "booking.no_show_fee_declined", "code.claimed", "code.replaced",
               "code.claim_rejected", "code.claim_refunded", "batch.quarantined", "payment.disputed",
               "payment.dispute_closed")
MAX_ENDPOINTS_PER_MERCHANT = 16
MAX_URL = 2048
SECRET_PREFIX = "whsec_"
RETRY_WINDOW_SECONDS = 3 * 24 * 3600.0
# Manual redeliveries per endpoint and minute (the database counts them: repository.REDELIVER).
REDELIVER_PER_MINUTE = "CUTY_WEBHOOK_REDELIVER_PER_MINUTE"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_hex(32)


def validate_url(url: str, environment: str, allow_private: bool = False) -> str:
    """The URL as registered: https (http only to a local receiver with CUTY_WEBHOOK_ALLOW_PRIVATE),
    no credentials or fragment, not a local name or a non-public IP literal, port 443 in production.
    A name is not resolved here: what it resolves to is checked at every connection (egress.py)."""
    url = url.strip()
    if not url:
        raise InvalidArgument("url", "url is required")
    if len(url) > MAX_URL or not url.isprintable() or any(c.isspace() for c in url):
        raise InvalidArgument("url", f"url must be at most {MAX_URL} printable characters without spaces")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError:
        raise InvalidArgument("url", "url is not a valid URL") from None
    host = (parts.hostname or "").lower()
    if not host:
        raise InvalidArgument("url", "url must name a host")
    if parts.username or parts.password:
        raise InvalidArgument("url", "url must not carry credentials")
    if parts.fragment:
        raise InvalidArgument("url", "url must not have a fragment")
    ip = parse_ip(host)
    local = refused_name(host) or (ip is not None and refusal(ip) is not None)
    # http:// only for a local receiver, and only where local receivers are allowed at all.
    if parts.scheme != "https" and not (parts.scheme == "http" and local and allow_private):
        raise InvalidArgument("url", "url must start with https://")
    if local and not allow_private:
        raise InvalidArgument("url", "url must be a public https:// address")
    if environment == "production" and (port or 443) not in PRODUCTION_PORTS:
        raise InvalidArgument("url", "url must use port 443")
    return url


def validate_events(events) -> list[str]:
    if not events:
        raise InvalidArgument("events", f"events must name at least one of {', '.join(EVENT_TYPES)}")
    out: list[str] = []
    for e in events:
        if e not in EVENT_TYPES:
            raise InvalidArgument("events", f"unknown event type {e[:64]!r}; known: {', '.join(EVENT_TYPES)}")
        if e not in out:
            out.append(e)
    return out


class WebhookEndpoints:
    def __init__(self, endpoints: Endpoints, environment: str, *, allow_private: bool | None = None,
                 redeliver_per_minute: int | None = None, metrics: RedeliveryMetrics | None = None):
        self.endpoints = endpoints
        self.environment = environment
        # The delivery workers' rule (production refuses CUTY_WEBHOOK_ALLOW_PRIVATE here as well).
        self.allow_private = Egress.from_env(environment, allow_private).allow_private
        self.redeliver_per_minute = (env_int(REDELIVER_PER_MINUTE, 10) if redeliver_per_minute is None
                                     else redeliver_per_minute)
        self.metrics = metrics or process_redelivery_metrics()

    async def create(self, caller: Principal, url: str, events) -> Endpoint:
        caller.require_role("admin")
        merchant = tenancy.owning_merchant(caller)
        url = validate_url(url, self.environment, self.allow_private)
        events = validate_events(events)
        if len(await self.endpoints.list(caller, merchant)) >= MAX_ENDPOINTS_PER_MERCHANT:
            raise FailedPrecondition(f"a merchant has at most {MAX_ENDPOINTS_PER_MERCHANT} webhook endpoints",
                                     reason="too-many-endpoints")
        return await self.endpoints.insert(caller, merchant, str(uuid.uuid4()), url, events, new_secret())

    async def list(self, caller: Principal) -> list[Endpoint]:
        caller.require_role("admin")
        return await self.endpoints.list(caller, tenancy.owning_merchant(caller))

    async def delete(self, caller: Principal, endpoint_id: str) -> None:
        caller.require_role("admin")
        eid = canonical_uuid("endpoint_id", endpoint_id)
        if not await self.endpoints.delete(caller, tenancy.owning_merchant(caller), eid):
            raise NotFound(f"webhook endpoint {eid} not found")

    async def deliveries(self, caller: Principal, endpoint_id: str, page_size: int,
                         page_token: str) -> tuple[list[Delivery], str]:
        caller.require_role("admin")
        eid = canonical_uuid("endpoint_id", endpoint_id)
        merchant = tenancy.owning_merchant(caller)
        size, before = paging.page_size(page_size), paging.decode_seq(page_token)
        if await self.endpoints.get(caller, merchant, eid) is None:
            raise NotFound(f"webhook endpoint {eid} not found")
        rows = await self.endpoints.deliveries(caller, merchant, eid, before, size)
        more = len(rows) == size and rows[-1].seq > 1
        return rows, paging.encode_seq(rows[-1].seq) if more else ""

    async def redeliver(self, caller: Principal, endpoint_id: str, delivery_id: str) -> Delivery:
        caller.require_role("admin")
        eid = canonical_uuid("endpoint_id", endpoint_id)
        did = canonical_uuid("delivery_id", delivery_id)
        got, outcome = await self.endpoints.redeliver(caller, tenancy.owning_merchant(caller), eid, did,
                                                      RETRY_WINDOW_SECONDS, self.redeliver_per_minute)
        if got is None:
            raise NotFound(f"delivery {did} of webhook endpoint {eid} not found")
        self.metrics.redeliveries.labels(outcome).inc()
        if outcome == "in_flight":
            raise FailedPrecondition("an attempt of this delivery is in flight; try again in a minute",
                                     reason="delivery-in-flight")
        if outcome == "rate_limited":
            # Retry-After at the gateway: the window is a minute at the most.
            raise ResourceExhausted(f"at most {self.redeliver_per_minute} redeliveries per endpoint and minute; "
                                    "try again in a minute", reason="redeliver-rate-limited",
                                    detail=error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=60)))
        return got
