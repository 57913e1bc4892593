"""Merchants as tenants (issue 14, docs/tenancy.md): whose rows a unit of work may see.

A merchant (an organisation: a salon chain, a shop) owns salons and products and everything made
from them. Its id is the `org` claim of its staff's and admins' tokens, carried to the services in
the gateway's signed user assertion (Principal.org), never in a free header. Customers have none
(they buy from any merchant and see their own purchases across merchants); a platform `operator`
reads across merchants, audited; the orchestrator (`system`) acts for every merchant.

Two lines of defence, both in SQL:
1. every staff/admin query filters by `merchant_id` (`merchant_filter(principal)` is its
   parameter: the merchant, or NULL for "any"); another merchant's object is NOT_FOUND;
2. Row-Level Security on every merchant's table (libs/cutylib/migrations/functions/),
   keyed on `cuty.merchant`: `scoped()` opens a transaction with SET LOCAL cuty.merchant = the
   caller's merchant, so a query that forgot its WHERE still sees nothing of anyone else's.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

import asyncpg

from .db import ALL_MERCHANTS, MERCHANT_SETTING, UnitOfWork
from .errors import Unauthenticated
from .principal import Principal, current

# Roles bound to one merchant; every other role sees across merchants (customers by their own
# customer id, the operator audited, the system for the saga).
MERCHANT_ROLES = frozenset({"staff", "admin"})
OPERATOR_ROLE = "operator"
# The merchant that rows created before merchants existed were moved into (the migrations).
DEFAULT_MERCHANT = "default"
MAX_MERCHANT_ID_LENGTH = 200


def merchant_filter(principal: Principal | None = None) -> str | None:
    """The merchant the caller's queries are confined to, or None (any merchant).

    A staff or admin caller without a merchant is refused (the gateway refuses such a token
    already; a service does not trust that it did)."""
    p = principal or current()
    if p.role in MERCHANT_ROLES:
        if not p.org:
            raise Unauthenticated(f"role {p.role!r} must belong to a merchant (the token's 'org' claim)")
        return p.org
    return None


def owning_merchant(principal: Principal | None = None) -> str:
    """The merchant new objects (salons, products) of an admin are created in."""
    merchant = merchant_filter(principal)
    if merchant is None:
        raise Unauthenticated("only a merchant's admin creates its objects (the token's 'org' claim)")
    return merchant


def setting_for(principal: Principal | None = None) -> str:
    """The `cuty.merchant` value of the caller's unit of work."""
    return merchant_filter(principal) or ALL_MERCHANTS


async def narrow(conn: asyncpg.Connection, principal: Principal | None = None) -> None:
    """Confine the current transaction of `conn` to the caller's merchant (SET LOCAL)."""
    await conn.execute("SELECT set_config($1, $2, true)", MERCHANT_SETTING, setting_for(principal))


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
    """A unit of work that sees only the caller's merchant's rows (all of them for a caller not
    bound to one). Commit it as any UnitOfWork; it rolls back otherwise."""
    async with UnitOfWork(pool, isolation=isolation) as uow:
        if merchant_filter(principal) is not None:
            await narrow(uow.conn, principal)
        yield uow
