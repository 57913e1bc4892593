"""Idempotency-Key handling of the checkout API (docs/architecture.md, invariant 7; saleor's pattern).

A key is one live row per (customer, operation, key). The first request inserts it `in_flight`
with a hash of the request; when it ends it stores its serialized answer, which replays return byte
for byte. The database decides every race: two requests with one key meet on the key's advisory
lock in `checkout_key_begin`, and an abandoned `in_flight` row (its process died) is taken over by
one conditional update there. The rows live in day partitions that leave whole once past
CUTY_CHECKOUT_IDEMPOTENCY_KEYS_RETENTION_DAYS (cutylib.retention); nothing deletes dead keys row by row.

    async with store.claim(customer, "create", key, request_hash, first) as claim:  # or Replay
        claim.finish(answer)

Every request goes this way: one without an Idempotency-Key gets a key generated here, so there is
one write path. The request's first write is part of the key's own statement
(`begin_with`), and its answer is stored by a plain FINISH once the request has it.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import asyncpg
from google.rpc import status_pb2

from cutylib import errors
from cutylib.grpc_errors import to_status

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 255
# The key made up for a request that came without one: a random UUID no client will send again,
# so the request runs once, through the same statements as any other ("one write path").
SERVER_KEY_PREFIX = "server:"

# Insert the key's row, or take over an in-flight one whose request died (locked_until passed) with
# the same request; a key whose row expired (24 h) is used afresh, as a new row. Returns nothing when
# the key belongs to a live request or already has an answer; the caller then reads the row to say
# which. The table is partitioned by day (its primary key holds created_at), so one live row per key
# across the partitions is the function's to keep (migrations/functions/checkout_key_begin.sql).
BEGIN = """
SELECT key_resource_id AS resource_id, key_resumed AS resumed, key_created_at AS created_at
FROM checkout_key_begin($1, $2, $3, $4, $5, $6::float8, $7::float8)
"""


EXISTING = """
SELECT request_hash, state, response, response_is_error FROM checkout_idempotency_keys
WHERE customer_id = $1 AND operation = $2 AND key = $3 AND expires_at > clock_timestamp()
"""

# The statements of a request after its BEGIN name its row whole ($4: its created_at, the partition key).
FINISH = """
UPDATE checkout_idempotency_keys SET state = 'done', response = $5, response_is_error = $6, locked_until = NULL
WHERE customer_id = $1 AND operation = $2 AND key = $3 AND created_at = $4 AND state = 'in_flight'
"""

# Bad input changed nothing, so it leaves no key behind either: the same key may be used again.
ABANDON = """
DELETE FROM checkout_idempotency_keys
WHERE customer_id = $1 AND operation = $2 AND key = $3 AND created_at = $4 AND state = 'in_flight'
"""

# The request failed without an answer (a dependency down): let the client's retry resume now.
UNLOCK = """
UPDATE checkout_idempotency_keys SET locked_until = clock_timestamp()
WHERE customer_id = $1 AND operation = $2 AND key = $3 AND created_at = $4 AND state = 'in_flight'
"""


class Replay(Exception):
    """The key already has an answer: return it unchanged."""

    def __init__(self, response: bytes, is_error: bool):
        super().__init__("replayed answer")
        self.response = response
        self.is_error = is_error

    def status(self) -> status_pb2.Status:
        return status_pb2.Status.FromString(self.response)


def request_hash(operation: str, *parts: str) -> bytes:
    h = hashlib.sha256(operation.encode())
    for p in parts:
        h.update(b"\x00" + p.encode())
    return h.digest()


def check_key(key: str) -> None:
    if len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise errors.InvalidArgument("idempotency-key",
                                     f"Idempotency-Key must be 1..{MAX_KEY_LENGTH} printable characters, "
                                     f"got {len(key)} characters")


@dataclass
class Claim:
    """A request's hold on its Idempotency-Key (IdempotencyStore.claim)."""
    resource_id: str              # the checkout the key names (CreateCheckout's new one)
    resumed: bool                 # an earlier request with this key died; this one takes over
    row: Any                      # what the request's first write returned
    created_at: Any = None        # the key row's partition key: names the row in FINISH / UNLOCK
    answer: Any = None

    def finish(self, answer: Any) -> None:
        """The request's answer: returned, and stored for replays when the block ends."""
        self.answer = answer


@dataclass
class IdempotencyStore:
    pool: asyncpg.Pool
    lease_seconds: float
    ttl_seconds: float
    # An answer as its replays give it back, byte for byte (checkout/views.py `stored`).
    encode: Callable[[Any], bytes]

    @contextlib.asynccontextmanager
    async def claim(self, customer: str, operation: str, key: str, req_hash: bytes,
                    first: tuple[str, tuple]) -> AsyncIterator[Claim]:
        """The key for one request, or Replay (raised) with its first answer:

            async with keys.claim(customer, "create", key, h, first) as claim:
                claim.finish(await work(claim.resource_id, claim.resumed, claim.row))
            return claim.answer

        `first`: (SQL, args) of the request's first write (CTEs ending in one named `first`, see
        `begin_with`), run in the key's own statement; `claim.row` is what it returned (its columns
        NULL when it wrote nothing). `claim.resumed`: this request takes over an earlier one with the
        same key whose process died. An empty `key` gets one generated here (the request is then
        simply not replayable by the client).

        The answer given to `finish` is stored for replays as `encode(answer)` (the store's: the
        API's bytes, without secrets). A DomainError marked `recorded` (the request did change
        something: a REJECTED checkout) is stored and replayed as the answer; UNAVAILABLE, ABORTED and
        DEADLINE_EXCEEDED (a saga stopped for the request's deadline goes on in a worker) leave the
        key to be resumed by a retry; other domain errors changed nothing and free the key; anything
        else (a dependency down, a crash) leaves the key to be resumed by a retry."""
        if key:
            check_key(key)
        else:
            key = f"{SERVER_KEY_PREFIX}{uuid.uuid4()}"
        claim = Claim(*await self._begin(customer, operation, key, req_hash, first))
        row = (customer, operation, key, claim.created_at)
        try:
            yield claim
        except errors.DomainError as exc:
            if getattr(exc, "recorded", False):
                await self.pool.execute(FINISH, *row, _status_bytes(exc), True)
            elif isinstance(exc, (errors.Unavailable, errors.Aborted, errors.DeadlineExceeded)):
                await self.pool.execute(UNLOCK, *row)
            else:
                await self.pool.execute(ABANDON, *row)
            raise
        except BaseException:
            try:
                await self.pool.execute(UNLOCK, *row)
            except Exception:  # noqa: BLE001 - the row's own lock expiry frees it anyway
                log.warning("could not unlock idempotency key", exc_info=True)
            raise
        if claim.answer is None:
            await self.pool.execute(UNLOCK, *row)
            raise RuntimeError(f"a {operation} request ended without finishing its Idempotency-Key")
        await self.pool.execute(FINISH, *row, self.encode(claim.answer), False)

    async def _begin(self, customer: str, operation: str, key: str, req_hash: bytes,
                     first: tuple[str, tuple]) -> tuple[str, bool, Any, Any]:
        args = (customer, operation, key, req_hash, uuid.uuid4(), self.lease_seconds, self.ttl_seconds)
        statement = begin_with(first[0])
        for _ in range(3):  # the row may expire or be freed between our two statements
            began = await self.pool.fetchrow(statement, *args, *first[1])
            if began is not None:
                return str(began["key_resource_id"]), began["key_resumed"], began, began["key_created_at"]
            row = await self.pool.fetchrow(EXISTING, customer, operation, key)
            if row is None:
                continue
            _answer_of(row, operation, key, req_hash)
            raise errors.Aborted(f"a {operation} request with Idempotency-Key {key!r} is still running; "
                                 "retry shortly", reason="idempotency-key-in-flight")
        raise errors.Aborted(f"Idempotency-Key {key!r} is contended; retry", reason="idempotency-key-in-flight")

    async def replay_if_answered(self, customer: str, operation: str, key: str, req_hash: bytes) -> None:
        """Raise Replay when `key` already has its answer (or the reuse error for another request).
        A request whose checks read other services before its first write (RescheduleCheckout) asks
        this first, so a replay gets the first answer even where the checks would now refuse."""
        if key:
            row = await self.pool.fetchrow(EXISTING, customer, operation, key)
            if row is not None:
                _answer_of(row, operation, key, req_hash)


def _answer_of(row, operation: str, key: str, req_hash: bytes) -> None:
    """The key's row seen by a request: another request's key is refused; an answered one replays."""
    if bytes(row["request_hash"]) != req_hash:
        raise errors.InvalidArgument(
            "idempotency-key", f"Idempotency-Key {key!r} was already used with a different {operation} "
                               "request", reason="idempotency-key-reused")
    if row["state"] == "done":
        raise Replay(bytes(row["response"]), row["response_is_error"])


@functools.cache
def begin_with(first: str) -> str:
    """BEGIN and the request's first write as one statement (one round trip, one commit). `first`
    is CTE text (`name AS (...)`, ..., the last one named `first`) that reads `began` (the key row
    just inserted or taken over; no row -> it must write nothing) and whose own parameters start
    at $8. The statement answers the key's columns and the first write's row (NULLs when it wrote
    nothing). The one place a statement is composed from parts."""
    return (f"WITH began AS ({BEGIN.strip()}), {first.strip()}\n"
            "SELECT began.resource_id AS key_resource_id, began.resumed AS key_resumed,\n"
            "       began.created_at AS key_created_at, first.*\n"
            "FROM began LEFT JOIN first ON true")


def _status_bytes(exc: errors.DomainError) -> bytes:
    st = to_status(exc)
    # grpc.Status carries the serialized google.rpc.Status in its trailing metadata.
    for k, v in st.trailing_metadata:
        if k == "grpc-status-details-bin":
            return v
    return status_pb2.Status(code=exc.code.value[0], message=exc.message).SerializeToString()
