"""What a statement read, for the tests that bound it: EXPLAIN (ANALYZE, BUFFERS) run and undone,
its plan's nodes, and the pages a node touched."""
from __future__ import annotations

import json
from typing import Iterator

import asyncpg


async def explained(conn: asyncpg.Connection, statement: str, *args) -> dict:
    """The top plan node of `statement` run under EXPLAIN (ANALYZE, BUFFERS), in a transaction (a
    savepoint inside the caller's) rolled back after: what it writes is undone."""
    tx = conn.transaction()
    await tx.start()
    try:
        (doc,) = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", *args))
    finally:
        await tx.rollback()
    return doc["Plan"]


def nodes(plan: dict) -> Iterator[dict]:
    """The node and every node under it."""
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def pages(node: dict) -> int:
    """Shared buffers the node touched, hit or read (a function's nested statements included)."""
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
