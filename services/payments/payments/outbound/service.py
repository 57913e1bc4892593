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

from cutylib import paging, tenancy
from cutylib.errors import FailedPrecondition, InvalidArgument, NotFound
from cutylib.fields import canonical_uuid
from cutylib.principal import Principal

from .repository import Delivery, Endpoint, Endpoints

# What the outbox produces today (trigger checkouts_merchant_events, migrations/functions/
# checkouts_merchant_events.sql; and `stock.low`, relayed from the code pool's outbox, relay.py).
EVENT_TYPES = ("checkout.completed", "booking.confirmed", "codes.delivered", "checkout.refunded",
               "booking.cancelled", "booking.rescheduled", "stock.low")
MAX_ENDPOINTS_PER_MERCHANT = 16
MAX_URL = 2048
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
SECRET_PREFIX = "whsec_"
RETRY_WINDOW_SECONDS = 3 * 24 * 3600.0


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_hex(32)


def validate_url(url: str, environment: str) -> str:
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
    del port
    host = (parts.hostname or "").lower()
    if not host:
        raise InvalidArgument("url", "url must name a host")
    if parts.username or parts.password:
        raise InvalidArgument("url", "url must not carry credentials")
    if parts.fragment:
        raise InvalidArgument("url", "url must not have a fragment")
    if parts.scheme == "https":
        if host in LOCAL_HOSTS and environment != "development":
            raise InvalidArgument("url", "url must be a public https:// address")
        return url
    if parts.scheme == "http" and host in LOCAL_HOSTS and environment == "development":
        return url  # a local receiver in development and tests
    raise InvalidArgument("url", "url must start with https://")


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
    def __init__(self, endpoints: Endpoints, environment: str):
        self.endpoints = endpoints
        self.environment = environment

    async def create(self, caller: Principal, url: str, events) -> Endpoint:
        caller.require_role("admin")
        merchant = tenancy.owning_merchant(caller)
        url = validate_url(url, self.environment)
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
        got, queued = await self.endpoints.redeliver(caller, tenancy.owning_merchant(caller), eid, did,
                                                     RETRY_WINDOW_SECONDS)
        if got is None:
            raise NotFound(f"delivery {did} of webhook endpoint {eid} not found")
        if not queued:
            raise FailedPrecondition("an attempt of this delivery is in flight; try again in a minute",
                                     reason="delivery-in-flight")
        return got
