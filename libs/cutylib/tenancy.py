"""Merchants as tenants (docs/tenancy.md): whose rows a unit of work may see.

A merchant (an organisation: a salon chain, a shop) owns salons and products and everything made
from them. Its id is the `org` claim of its staff's and admins' tokens, carried to the services in
the gateway's signed user assertion (Principal.org), never in a free header. Customers have none
(they buy from any merchant and see their own purchases across merchants); a platform `operator`
reads across merchants, audited; the orchestrator (`system`) acts for every merchant.

Two lines of defence, both in SQL:
1. every staff/admin query filters by `merchant_id` (`merchant_filter(principal)` is its
   parameter: the merchant, or NULL for "any"); another merchant's object is NOT_FOUND;
2. Row-Level Security on every merchant's table (libs/cutylib/migrations/functions/),
   keyed on `cuty.merchant`, failing closed (unset: no rows): `scoped()` opens a transaction with
   SET LOCAL cuty.merchant = the caller's merchant, and any statement of such a caller outside it
   is narrowed the same way by the pool (cutylib.db.BoundedPool), so a query that forgot its WHERE
   still sees nothing of anyone else's. Callers not bound to a merchant see what the service's
   pool declares (`create_pool(merchant=ALL_MERCHANTS)`).
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import asyncpg

from .db import UnitOfWork
from .errors import Unauthenticated
from .principal import MERCHANT_ROLES, Principal, current

OPERATOR_ROLE = "operator"
# The merchant that rows created before merchants existed were moved into (the migrations).
DEFAULT_MERCHANT = "default"
MAX_MERCHANT_ID_LENGTH = 200


def merchant_id_problem(org: object) -> str | None:
    """Why `org` cannot be a merchant id, or None when it can. '*' (every merchant, the value of
    `cuty.merchant` for the service's own paths) and any other value holding '*', surrounding
    blanks or control characters are refused: a token's claim must never widen what Row-Level
    Security shows, nor be confused with a setting's special value."""
    if not isinstance(org, str) or not org.strip():
        return "must be a non-empty string"
    if len(org) > MAX_MERCHANT_ID_LENGTH:
        return f"must be at most {MAX_MERCHANT_ID_LENGTH} characters"
    if "*" in org or org != org.strip() or any(ord(ch) < 32 or ord(ch) == 127 for ch in org):
        return "must not hold '*', surrounding blanks or control characters (reserved)"
    return None


def merchant_filter(principal: Principal | None = None) -> str | None:
    """The merchant the caller's queries are confined to, or None (any merchant).

    A staff or admin caller without a merchant is refused (the gateway refuses such a token
    already; a service does not trust that it did)."""
    return (principal or current()).merchant()


def owning_merchant(principal: Principal | None = None) -> str:
    """The merchant new objects (salons, products) of an admin are created in."""
    merchant = merchant_filter(principal)
    if merchant is None:
        raise Unauthenticated("only a merchant's admin creates its objects (the token's 'org' claim)")
    return merchant


async def fetchrow(pool: asyncpg.Pool, query: str, *args, principal: Principal | None = None):
    """`pool.fetchrow` for a caller not bound to a merchant; inside `scoped()` for one that is."""
    return await _read("fetchrow", pool, query, args, principal)


async def fetch(pool: asyncpg.Pool, query: str, *args, principal: Principal | None = None) -> list:
    """`pool.fetch` for a caller not bound to a merchant; inside `scoped()` for one that is."""
    return await _read("fetch", pool, query, args, principal)


async def _read(method: str, pool: asyncpg.Pool, query: str, args: tuple, principal: Principal | None):
    if principal is None or merchant_filter(principal) is None:
        return await getattr(pool, method)(query, *args)
    async with scoped(pool, principal) as uow:
        return await getattr(uow.conn, method)(query, *args)


@asynccontextmanager
async def scoped(pool: asyncpg.Pool, principal: Principal | None = None, *,
                 isolation: str = "read_committed") -> AsyncIterator[UnitOfWork]:
    """A unit of work that sees only the caller's merchant's rows (for a caller not bound to one,
    those the pool declares: every merchant's for a service's pool). The setting goes out with the
    BEGIN (cutylib.db.UnitOfWork). Commit it as any UnitOfWork; it rolls back otherwise."""
    merchant = merchant_filter(principal)
    if merchant is None:
        merchant = getattr(pool, "merchant", None)
    async with UnitOfWork(pool, isolation=isolation, merchant=merchant) as uow:
        yield uow
