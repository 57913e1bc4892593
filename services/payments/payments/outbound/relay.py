"""The relay of the code pool's `stock.low` events into the merchant events
(docs/webhooks-out.md "stock.low: relayed from the code pool").

The code pool owns stock and writes `stock.low` into its own outbox (codepool's stock_events) in the
statement that changes the stock. This loop, a background task of every payments replica, carries
the events over: one round takes the feed's cursor row FOR UPDATE SKIP LOCKED (one replica relays at
a time; the others find it locked and wait for the next round), asks the code pool for the events
after it (ListStockEvents), and in the same transaction stores them in merchant_events (ON CONFLICT
on the event id), fans them out to the subscribed endpoints and moves the cursor past them. So:

- a crash of the relay (or of its database connection, or of the code pool mid-call) before the
  commit stores nothing and moves nothing: the next round reads the same events again;
- an event read twice (a cursor restored from a backup, a reset) is stored and delivered once: its
  id is the merchant event's id, and deliveries are made only for events this round inserted.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import asyncpg
import grpc

from cuty.codepool.v1 import codepool_pb2 as cp
from cutylib.config import env_field, env_float, env_int
from cutylib.db import UnitOfWork
from cutylib.periodic import TRANSIENT, periodic
from cutylib.telemetry import quiet, untraced_call_metadata
from cutylib.timestamps import from_timestamp

from .repository import NOTIFY_CHANNEL

log = logging.getLogger(__name__)

FEED = "codepool.stock"

# What a claim's step reads as in the payment's timeline ("code.replaced: claim 7c1e... on code
# 0f3a... (does_not_work: \"the pin is refused\"), replaced by code 51b2... by admin:ana"), from the
# event's payload.claim (codepool_claim_json: never a code value).
TIMELINE_NOTE = """format('claim %s on code %s (%s: %s)%s%s%s',
    i.payload::jsonb #>> '{data,claim,id}', i.payload::jsonb #>> '{data,claim,code_id}',
    i.payload::jsonb #>> '{data,claim,kind}', to_json(i.payload::jsonb #>> '{data,claim,reason}'),
    ', opened by ' || (i.payload::jsonb #>> '{data,claim,opened_by}'),
    ', replaced by code ' || (i.payload::jsonb #>> '{data,claim,replacement_code_id}'),
    ', resolved by ' || (i.payload::jsonb #>> '{data,claim,resolved_by}')
        || coalesce(': ' || (i.payload::jsonb #>> '{data,claim,resolution_note}'), ''))"""

CLAIM_FEED = "SELECT after_seq FROM outbound_feeds WHERE feed = $1 FOR UPDATE SKIP LOCKED"

# The events of one page, their deliveries, the cursor and the wake-up of the delivery workers, in
# one statement of the transaction that holds the cursor row. $1..$5: the events' columns (payload as
# text, cast here); $6 the feed; $7 the page's last seq; $8 the order (checkout) each is about, or ''.
# An event about an order (a claim's: docs/codepool.md, "Claims") is also appended to the checkout's
# payment timeline (source 'claim'), only when this round stored it: once, with its merchant event.
STORE = f"""
WITH incoming AS (
    SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[], $8::text[])
        AS t(merchant_id, id, type, payload, created_at, order_id)
), ev AS (
    INSERT INTO merchant_events (merchant_id, id, type, checkout_id, payload, created_at)
    SELECT merchant_id, id, type, NULL, payload::jsonb, created_at FROM incoming
    ON CONFLICT (merchant_id, id) DO NOTHING
    RETURNING merchant_id, id, type
), d AS (
    INSERT INTO webhook_deliveries (merchant_id, endpoint_id, event_id, next_attempt_at, give_up_at, created_at)
    SELECT ev.merchant_id, w.id, ev.id, clock_timestamp(), clock_timestamp() + interval '3 days', clock_timestamp()
    FROM ev JOIN webhook_endpoints w ON w.merchant_id = ev.merchant_id AND ev.type = ANY (w.events)
    RETURNING merchant_id
), tl AS (
    INSERT INTO payment_events (payment_id, checkout_id, source, to_status, note, merchant_id, created_at)
    SELECT c.payment_id, c.id, 'claim', i.type, {TIMELINE_NOTE}, c.merchant_id, i.created_at
    FROM ev
    JOIN incoming i ON i.merchant_id = ev.merchant_id AND i.id = ev.id
    JOIN checkouts c ON c.id = CASE WHEN i.order_id ~ '^[0-9a-fA-F-]{{36}}$' THEN i.order_id::uuid END
                    AND c.merchant_id = ev.merchant_id
    RETURNING 1
), cursor AS (
    UPDATE outbound_feeds SET after_seq = $7, relayed = relayed + (SELECT count(*) FROM ev),
                              updated_at = clock_timestamp()
    WHERE feed = $6 AND after_seq < $7
    RETURNING after_seq
)
SELECT (SELECT count(*) FROM ev) AS stored, (SELECT count(*) FROM d) AS deliveries,
       (SELECT count(*) FROM cursor) AS advanced, (SELECT count(*) FROM tl) AS timeline,
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', m)) FROM (SELECT DISTINCT merchant_id AS m FROM d) x) AS woken
"""


@dataclass(frozen=True)
class RelayOptions:
    poll_seconds: float = env_field(env_float, "CUTY_STOCK_RELAY_POLL_SECONDS", 1.0)
    page_size: int = env_field(env_int, "CUTY_STOCK_RELAY_PAGE_SIZE", 200)


class StockEventRelay:
    """`relay_once` is one round; `run` is the background task. `stub`: a CodePoolServiceStub."""

    def __init__(self, pool, stub, options: RelayOptions | None = None):
        self.pool = pool
        self.stub = stub
        self.options = options or RelayOptions()
        self.relayed_total = 0

    async def relay_page(self, *, before_commit=None) -> tuple[int, bool] | None:
        """Relay one page: (events newly stored, whether the page was full), or None when another
        replica holds the feed. `before_commit` (tests): awaited with the connection just before the
        commit, where a crash hurts most."""
        async with UnitOfWork(self.pool) as uow:
            after = await uow.conn.fetchval(CLAIM_FEED, FEED)
            if after is None:
                return None
            page = await self.stub.ListStockEvents(
                cp.ListStockEventsRequest(after_seq=after, page_size=self.options.page_size),
                metadata=untraced_call_metadata())  # a poll: no trace in the code pool either
            events = list(page.events)
            if not events:
                return 0, False
            row = await uow.conn.fetchrow(
                STORE, [e.merchant_id for e in events], [e.id for e in events], [e.type for e in events],
                [e.payload_json for e in events], [from_timestamp(e.create_time) for e in events],
                FEED, events[-1].seq, [e.order_id for e in events])
            if before_commit is not None:
                await before_commit(uow.conn)
            await uow.commit()
        if row["stored"]:
            log.info("stock events relayed", extra={"stored": row["stored"], "deliveries": row["deliveries"],
                                                    "after_seq": events[-1].seq})
        self.relayed_total += row["stored"]
        return row["stored"], len(events) >= self.options.page_size

    async def relay_once(self) -> int:
        """Pages until the feed is drained (or another replica holds it); returns the events stored."""
        total = 0
        with quiet():  # an idle round starts no trace
            while True:
                got = await self.relay_page()
                if got is None:
                    return total
                total += got[0]
                if not got[1]:
                    return total

    async def run(self) -> None:
        # A connection killed under the round can surface as asyncpg's InternalClientError (the
        # server's goodbye racing the COMMIT): the round is lost (nothing committed), not the task.
        await periodic(self.relay_once, self.options.poll_seconds, what="stock event relay", log=log,
                       retry_on=(*TRANSIENT, asyncpg.InternalClientError, grpc.aio.AioRpcError, asyncio.TimeoutError))
