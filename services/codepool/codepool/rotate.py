"""Key rotation: re-encrypt codes under the active key, in batches, while the service runs.

Run after every replica has the new key in its keyring (`active=` pointing at it); rows under an
older key keep decrypting until their batch is rotated, then the old key can be dropped.

Each batch locks its rows with `FOR UPDATE SKIP LOCKED` (buyers holding a code are skipped, never
waited for, and picked up by a later pass) and rewrites them with a conditional update.
`python -m codepool rotate --help`.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Callable

import asyncpg

from cutylib.db import UnitOfWork

from .keys import Keyring

log = logging.getLogger("codepool.rotate")

# Walks the primary key from a cursor, so a full pass reads the table once.
CLAIM_BATCH = """
SELECT id, product_id, key_id, nonce, ciphertext FROM codes
WHERE id > $1 AND key_id <> $2 AND ($3::uuid IS NULL OR product_id = $3)
ORDER BY id
LIMIT $4
FOR UPDATE SKIP LOCKED
"""
REWRITE = """
UPDATE codes c SET key_id = $1, nonce = u.nonce, ciphertext = u.ciphertext
FROM unnest($2::uuid[], $3::bytea[], $4::bytea[], $5::text[]) AS u(id, nonce, ciphertext, old_key)
WHERE c.id = u.id AND c.key_id = u.old_key
"""
# One entry per merchant of the batch (a batch walks the primary key across products): each
# merchant's audit log names only its own codes.
AUDIT = """
INSERT INTO audit_log (merchant_id, actor, action, code_ids, details)
SELECT c.merchant_id, $1, 'rotate', array_agg(c.id ORDER BY c.id), $3
FROM codes c WHERE c.id = ANY($2::uuid[])
GROUP BY c.merchant_id
"""
REMAINING = "SELECT count(*) FROM codes WHERE key_id <> $1 AND ($2::uuid IS NULL OR product_id = $2)"

ZERO = uuid.UUID(int=0)


@dataclass
class RotationResult:
    rotated: int = 0
    remaining: int = 0
    passes: int = 0


async def rotate_batch(pool: asyncpg.Pool, keyring: Keyring, after: uuid.UUID, batch_size: int,
                       product_id: uuid.UUID | None, actor: str) -> tuple[int, uuid.UUID | None]:
    """Rotate one batch after `after`; returns (rows rewritten, cursor for the next batch or None at the end)."""
    async with UnitOfWork(pool) as uow:
        rows = await uow.conn.fetch(CLAIM_BATCH, after, keyring.active, product_id, batch_size)
        if not rows:
            return 0, None
        ids, nonces, cts, old = [], [], [], []
        for r in rows:
            plain = keyring.decrypt(r["id"].bytes, r["product_id"].bytes, r["key_id"], r["nonce"], r["ciphertext"])
            _, nonce, ct = keyring.encrypt(r["id"].bytes, r["product_id"].bytes, plain)
            ids.append(r["id"])
            nonces.append(nonce)
            cts.append(ct)
            old.append(r["key_id"])
        status = await uow.conn.execute(REWRITE, keyring.active, ids, nonces, cts, old)
        await uow.conn.execute(AUDIT, actor, ids, {"to_key": keyring.active, "from_keys": sorted(set(old))})
        await uow.commit()
    return int(status.split()[-1]), rows[-1]["id"]


async def rotate(pool: asyncpg.Pool, keyring: Keyring, *, batch_size: int = 1000, product_id: uuid.UUID | None = None,
                 max_passes: int = 10, actor: str = "system:rotate",
                 progress: Callable[[int], None] | None = None) -> RotationResult:
    """Re-encrypt every code not under the active key. Rows locked by buyers during a pass are left
    for the next pass; stops when none is left (or after `max_passes`, reporting what remains)."""
    result = RotationResult()
    while result.passes < max_passes:
        result.passes += 1
        cursor: uuid.UUID | None = ZERO
        while cursor is not None:
            n, cursor = await rotate_batch(pool, keyring, cursor, batch_size, product_id, actor)
            result.rotated += n
            if progress and n:
                progress(n)
        result.remaining = await pool.fetchval(REMAINING, keyring.active, product_id)
        if result.remaining == 0:
            break
    log.info("rotation finished", extra={"rotated": result.rotated, "remaining": result.remaining,
                                         "passes": result.passes, "active_key": keyring.active})
    return result


async def remaining(pool: asyncpg.Pool, keyring: Keyring, product_id: uuid.UUID | None = None) -> int:
    return await pool.fetchval(REMAINING, keyring.active, product_id)
