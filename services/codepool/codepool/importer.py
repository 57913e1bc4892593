"""Importing supplier batches: any size, bounded memory, all or nothing ("ImportCodes").

The stream is encrypted chunk by chunk and copied (COPY) into a temporary staging table inside one
transaction; only then are duplicates counted, in SQL, by keyed hash, within the batch and against
the product's codes. A batch with any duplicate is refused whole; otherwise all of it is moved into
`codes` in one statement. Nothing is visible to anyone until the commit.

Merchants: an admin imports only into its own merchant's products (another's is
NOT_FOUND, as a missing one), inside `tenancy.scoped`; the operator CLI (`python -m codepool
import`, the code pool's own identity: `system`) imports into any product. Either way the batch,
the codes and the audit entries take their merchant from the product row, in SQL.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import AsyncIterable, AsyncIterator

import asyncpg

from cutylib import tenancy
from cutylib.errors import Aborted, AlreadyExists, InvalidArgument, NotFound, Unavailable
from cutylib.fields import parse_uuid
from cutylib.principal import Principal

from . import domain
from .keys import Keyring

log = logging.getLogger("codepool.import")

STAGE = "codepool_import_stage"
STAGE_COLUMNS = ("pos", "id", "key_id", "nonce", "ciphertext", "code_hash")
CREATE_STAGE = f"""
CREATE TEMPORARY TABLE {STAGE} (pos bigint, id uuid, key_id text, nonce bytea, ciphertext bytea, code_hash bytea)
ON COMMIT DROP
"""
# Serialises imports of one product from here to the commit, so two batches carrying the same code
# cannot both pass the duplicate check. An advisory lock, not the product row's: the `stock.low`
# decision (codepool_check_stock) updates that row while holding the product's stock lock, so an
# import holding the row from here, then waiting at its insert for a counter row (product_stock)
# whose holder waits for that stock lock, closed a deadlock cycle.
LOCK_PRODUCT = "SELECT pg_advisory_xact_lock(hashtextextended('codepool.import:' || $1::uuid::text, 0))"
# The product's merchant, if the caller may import into it ($2: the caller's merchant, NULL for any).
PRODUCT_MERCHANT = "SELECT merchant_id FROM products WHERE id = $1 AND ($2::text IS NULL OR merchant_id = $2)"
FIND_BATCH = """
SELECT id, imported, content_digest FROM supplier_batches WHERE merchant_id = $3 AND product_id = $1 AND batch_ref = $2
"""
# Codes of the batch that repeat an earlier one of the batch or one the product already has
# ($2: the product's merchant, the leading column of the unique index).
COUNT_DUPLICATES = f"""
SELECT (SELECT count(*) FROM {STAGE}) - count(*)
FROM (SELECT DISTINCT code_hash FROM {STAGE}) s
WHERE NOT EXISTS (SELECT FROM codes c WHERE c.merchant_id = $2 AND c.product_id = $1 AND c.code_hash = s.code_hash)
"""
INSERT_BATCH = """
INSERT INTO supplier_batches (merchant_id, id, product_id, batch_ref, received, imported, content_digest, actor)
SELECT p.merchant_id, $1, p.id, $3, $4, $4, $5, $6 FROM products p WHERE p.id = $2
"""
# In stream order, so codes are handed out (seq) in the order the supplier listed them. The merchant
# is the product's (an InitPlan, read once).
MOVE_CODES = f"""
INSERT INTO codes (merchant_id, id, product_id, batch_id, key_id, nonce, ciphertext, code_hash)
SELECT (SELECT p.merchant_id FROM products p WHERE p.id = $1), id, $1, $2, key_id, nonce, ciphertext, code_hash
FROM {STAGE} ORDER BY pos
"""
AUDIT = """
INSERT INTO audit_log (merchant_id, actor, action, product_id, details)
SELECT p.merchant_id, $1, $2, p.id, $4 FROM products p WHERE p.id = $3
"""


@dataclass(frozen=True)
class ImportResult:
    batch_id: str
    received: int
    imported: int
    rejected_duplicates: int
    accepted: bool


@dataclass(frozen=True)
class Chunk:
    product_id: str
    batch_ref: str
    codes: list[str]


class Importer:
    """An import holds one connection and its transaction for as long as its stream lasts, so
    imports are limited: at most `concurrency` at once, each waiting at most
    `slot_wait_seconds` for its turn (then UNAVAILABLE), and a stream silent for `idle_seconds` is
    given up (ABORTED, rolled back, connection returned). Stalled uploads can therefore never take
    the connections buyers need."""

    def __init__(self, pool: asyncpg.Pool, keyring: Keyring, *, chunk_rows: int = 5000, concurrency: int = 4,
                 idle_seconds: float = 30.0, slot_wait_seconds: float = 5.0):
        self.pool = pool
        self.keyring = keyring
        self.chunk_rows = chunk_rows
        self.idle_seconds = idle_seconds
        self.slot_wait_seconds = slot_wait_seconds
        self._slots = asyncio.Semaphore(concurrency)

    def _seal(self, product: uuid.UUID, codes: list[str], offset: int) -> tuple[list[tuple], bytes]:
        """Encrypt and hash one chunk (run in a thread: the event loop keeps serving buyers)."""
        kr, pid = self.keyring, product.bytes
        records, hashes = [], []
        for pos, code_id, value in zip(range(offset, offset + len(codes)), domain.new_code_ids(len(codes)), codes):
            key_id, nonce, ct = kr.encrypt(code_id.bytes, pid, value)
            h = kr.code_hash(value)
            records.append((pos, code_id, key_id, nonce, ct, h))
            hashes.append(h)
        return records, b"".join(hashes)

    async def import_batch(self, chunks: AsyncIterable[Chunk], actor: str, principal: Principal) -> ImportResult:
        stream = _idle_bounded(chunks, self.idle_seconds)
        first = await anext(stream, None)
        if first is None:
            raise InvalidArgument("codes", "the import stream carried no message")
        product = parse_uuid("product_id", first.product_id)
        batch_ref = domain.require_id("batch_ref", first.batch_ref)
        try:
            await asyncio.wait_for(self._slots.acquire(), self.slot_wait_seconds)
        except TimeoutError:
            raise Unavailable("too many imports are in progress; retry later") from None
        try:
            return await self._import(first, stream, product, batch_ref, actor, principal)
        finally:
            self._slots.release()

    async def _import(self, first: Chunk, stream: AsyncIterator[Chunk], product: uuid.UUID, batch_ref: str,
                      actor: str, principal: Principal) -> ImportResult:
        async with tenancy.scoped(self.pool, principal) as uow:
            conn = uow.conn
            merchant = await conn.fetchval(PRODUCT_MERCHANT, product, tenancy.merchant_filter(principal))
            if merchant is None:
                # missing and another merchant's read the same (existence is not leaked)
                raise NotFound(f"no product {product}")
            await conn.execute(CREATE_STAGE)
            digest = hashlib.sha256()
            received = 0
            # The database copies one chunk while the next is encrypted: two CPUs at work, not one.
            copying: asyncio.Future | None = None
            try:
                async for codes in _rechunk(first, stream, self.chunk_rows):
                    domain.require_codes(codes, offset=received)
                    records, hashes = await asyncio.to_thread(self._seal, product, codes, received)
                    digest.update(hashes)
                    if copying is not None:
                        await copying
                    copying = asyncio.ensure_future(
                        conn.copy_records_to_table(STAGE, records=records, columns=STAGE_COLUMNS))
                    received += len(codes)
                if copying is not None:
                    await copying
            finally:
                if copying is not None and not copying.done():
                    # a bad chunk or a dropped stream: let the copy finish before the rollback uses conn
                    await asyncio.gather(copying, return_exceptions=True)
            if received == 0:
                raise InvalidArgument("codes", "a batch needs at least one code")
            await conn.execute(f"ANALYZE {STAGE}")
            await conn.fetchval(LOCK_PRODUCT, product)
            stored = await conn.fetchrow(FIND_BATCH, product, batch_ref, merchant)
            if stored is not None:
                # A retried upload of a batch already imported answers as the first one did.
                if stored["content_digest"] != digest.digest():
                    raise AlreadyExists(f"batch {batch_ref!r} of product {product} was imported with other codes",
                                        reason="batch-ref-taken")
                return ImportResult(str(stored["id"]), received, stored["imported"], 0, True)
            duplicates = await conn.fetchval(COUNT_DUPLICATES, product, merchant)
            details = {"batch_ref": batch_ref, "received": received, "rejected_duplicates": duplicates}
            if duplicates:
                await uow.rollback()
                # The refusal is recorded in a unit of work of its own (the batch's is rolled back),
                # narrowed to the caller's merchant like the batch's; the entry's merchant is the
                # product's, read in SQL.
                async with tenancy.scoped(self.pool, principal) as refusal:
                    await refusal.conn.execute(AUDIT, actor, "import_rejected", product, details)
                    await refusal.commit()
                log.warning("import refused: duplicate codes", extra={"product_id": str(product), **details})
                return ImportResult("", received, 0, duplicates, False)
            batch_id = uuid.uuid4()
            await conn.execute(INSERT_BATCH, batch_id, product, batch_ref, received, digest.digest(), actor)
            await conn.execute(MOVE_CODES, product, batch_id)
            await conn.execute(AUDIT, actor, "import", product, {**details, "batch_id": str(batch_id)})
            await uow.commit()
        log.info("codes imported", extra={"product_id": str(product), "batch_id": str(batch_id), "imported": received})
        return ImportResult(str(batch_id), received, received, 0, True)


async def _idle_bounded(chunks: AsyncIterable[Chunk], seconds: float) -> AsyncIterator[Chunk]:
    """The stream's messages, or ABORTED when none arrives for `seconds`."""
    it = aiter(chunks)
    while True:
        try:
            # asyncio.timeout, not wait_for: the read stays in the handler's own task (gRPC's
            # request stream must be read from there).
            async with asyncio.timeout(seconds):
                chunk = await anext(it)
        except StopAsyncIteration:
            return
        except TimeoutError:
            log.warning("import stream idle; given up", extra={"idle_seconds": seconds})
            raise Aborted(f"the import stream sent nothing for {seconds:g} s; it was given up, nothing was "
                          "imported", reason="import-stream-idle") from None
        yield chunk


async def _rechunk(first: Chunk, rest: AsyncIterator[Chunk], size: int) -> AsyncIterator[list[str]]:
    """Regroup the caller's messages (any sizes) into lists of about `size` codes; checks that later
    messages name the same product and batch as the first (or leave them empty)."""
    buf: list[str] = list(first.codes)
    async for chunk in rest:
        for name, value, expected in (("product_id", chunk.product_id, first.product_id),
                                      ("batch_ref", chunk.batch_ref, first.batch_ref)):
            if value and value != expected:
                raise InvalidArgument(name, f"every message of one import names the same {name}; "
                                            f"expected {expected!r}, got {value!r}")
        buf.extend(chunk.codes)
        if len(buf) >= size:
            full = len(buf) - len(buf) % size
            for i in range(0, full, size):
                yield buf[i:i + size]
            buf = buf[full:]
    if buf:
        yield buf
