"""Live updates of checkouts: WatchCheckout's stream, driven by LISTEN/NOTIFY.

Every change of a checkout's state or version sends `pg_notify('cuty_checkout_events', id)` in the
transaction that made it (trigger checkouts_notify_watchers), delivered at commit.
Each payments process holds ONE listening connection (`Watchers.run`, a background task on
cutylib.listen, which listens again when the connection is lost) and fans each notification out to the streams of this
process that watch that checkout; nothing polls per client. A stream that is told re-reads the
checkout's transitions after the last id it sent and sends what is new.

Resuming: a stream subscribes BEFORE its first read, so a change committed between the replay read
and going live is heard (its notification sets the flag the loop waits on), and ids only grow, so
nothing is sent twice. The listener's one outage behaviour (cutylib.listen: a lost connection may
have missed notifications) is answered here by a re-read: once listening again, every stream reads
the log after its last id (what was committed while nobody listened is there).

`hold-expiring` is a timer per stream, set from the database clock when the stream starts (the
hold's expire_time minus CUTY_HOLD_EXPIRING_WARNING_SECONDS), sent once if the checkout is still
HELD or AWAITING_ACTION when it fires.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg

from cuty.payments.v1 import checkout_pb2
from cutylib import errors
from cutylib.fields import canonical_uuid
from cutylib.listen import listen
from cutylib.principal import Principal
from cutylib.timestamps import to_timestamp

from . import domain, repository as repo, views
from .settings import CheckoutOptions

log = logging.getLogger(__name__)

STATE_CHANGED = "state-changed"
ACTION_REQUIRED = "payment-action-required"
HOLD_EXPIRING = "hold-expiring"
# States in which a hold can still run out under the buyer (the warning is only sent in these).
_HOLDING = frozenset({domain.HELD, domain.AWAITING_ACTION})
CLAIM_ROUNDS = 3


def event_type(state: str) -> str:
    return ACTION_REQUIRED if state == domain.AWAITING_ACTION else STATE_CHANGED


class Watchers:
    """The process's listener and the open streams: checkout id -> the flags of its watchers, this
    process's count of streams (its own cap) and its leased places under the per-user cap (in the
    database, table watch_streams, so the cap holds across replicas)."""

    def __init__(self, pool: asyncpg.Pool, options: CheckoutOptions):
        self.pool = pool
        self.options = options
        self._subs: dict[str, set[asyncio.Event]] = defaultdict(set)
        # This process's name on its streams' places, renewed together while the listener runs.
        self.process = f"watch:{secrets.token_hex(8)}"
        self.lease_seconds = max(30.0, 3 * options.watch_check_seconds)
        self._open = 0
        self.connected = asyncio.Event()  # set while the LISTEN connection is up (tests wait on it)
        self.reconnects = 0
        self._pid: int | None = None  # the listening connection's backend

    # -- the streams' side ------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def admitted(self, user: str):
        """One open stream of `user`, refused beyond the caps (RESOURCE_EXHAUSTED): the per-user one
        across every replica (a leased place in watch_streams), and this process's."""
        if self._open >= self.options.max_watch_streams:
            raise errors.ResourceExhausted("this server has as many open watch streams as it takes; retry later",
                                           reason="too-many-watch-streams")
        stream = secrets.token_hex(8)
        place = None
        for _ in range(CLAIM_ROUNDS):  # a lost race for one place tries the next free one
            place = await self.pool.fetchval(repo.CLAIM_WATCH_PLACE, user, self.process, stream,
                                             self.options.max_watch_streams_per_user, self.lease_seconds)
            if place is not None:
                break
        if place is None:
            raise errors.ResourceExhausted(
                f"at most {self.options.max_watch_streams_per_user} open watch streams per user; close one first",
                reason="too-many-watch-streams")
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1
            try:  # shielded: a stream ends by cancellation when its client goes away
                await asyncio.shield(self.pool.execute(repo.RELEASE_WATCH_PLACE, user, place, stream))
            except Exception:  # noqa: BLE001 - the lease runs out instead
                log.warning("watch stream place not released; its lease frees it", exc_info=True)

    @contextlib.asynccontextmanager
    async def subscribed(self, checkout_id: str):
        """A flag set whenever `checkout_id` changes (or the listener reconnected)."""
        flag = asyncio.Event()
        self._subs[checkout_id].add(flag)
        try:
            yield flag
        finally:
            subs = self._subs.get(checkout_id)
            if subs is not None:
                subs.discard(flag)
                if not subs:
                    del self._subs[checkout_id]

    @property
    def open_streams(self) -> int:
        return self._open


    def _notify(self, payload: str) -> None:
        for flag in self._subs.get(payload, ()):
            flag.set()

    def _wake_all(self) -> None:
        for subs in self._subs.values():
            for flag in subs:
                flag.set()

    # -- the listener (a background task of the payments server) ------------------------------------
    async def run(self) -> None:
        """LISTEN on one connection for the process's life (cutylib.listen), renewing this process's
        places (per-user cap) on it every watch_check_seconds: one statement per period, which also
        finds a connection lost without a FIN. Once listening again after a lost connection, every
        stream re-reads: what was committed while nobody listened is in the event log."""
        await listen(self.pool, repo.WATCH_CHANNEL, self._notify, on_listening=self._listening, retry=0.2,
                     tick=self._renew_places, every=self.options.watch_check_seconds)

    async def _renew_places(self, conn: asyncpg.Connection) -> None:
        self._pid = conn.get_server_pid()
        await conn.execute(repo.RENEW_WATCH_PLACES, self.process, self.lease_seconds)

    def _listening(self, up: bool) -> None:
        if up:
            self.connected.set()
            self._wake_all()  # may have missed notifications: every stream reads again
        elif self.connected.is_set():
            self.connected.clear()
            self.reconnects += 1
            self._pid = None

    async def listener_pid(self) -> int | None:
        """The backend pid of the listening connection (tests terminate it)."""
        return self._pid


async def watch(service, watchers: Watchers, caller: Principal, checkout_id: str,
                after_event_id: int) -> AsyncIterator[checkout_pb2.CheckoutEvent]:
    """WatchCheckout: the checkout's events for `caller` (who must be able to GetCheckout it).
    Raises before the first event (NOT_FOUND, RESOURCE_EXHAUSTED), never after."""
    checkout_id = canonical_uuid("checkout_id", checkout_id)
    if after_event_id < 0:
        raise errors.InvalidArgument("after_event_id", f"after_event_id must be 0 or an event id, got {after_event_id}")
    saga = await service.seen(caller, checkout_id)
    sagas = repo.Sagas(service.pool)
    async with watchers.admitted(caller.subject), watchers.subscribed(checkout_id) as changed:
        await service.operator_reads.record(caller, "WatchCheckout", checkout_id, saga.merchant_id)
        yield None  # admitted: the caller may now be told the stream is open
        loop = asyncio.get_running_loop()
        warn_at = None
        if saga.state in _HOLDING and saga.expire_time is not None:
            lead = timedelta(seconds=watchers.options.hold_warning_seconds)
            if saga.expire_time > saga.read_at:  # a hold that already ran out gets no warning
                warn_at = loop.time() + max(0.0, (saga.expire_time - lead - saga.read_at).total_seconds())
        last = after_event_id
        if last == 0:
            # Subscribed already: the state read here or anything after it is heard.
            first = await sagas.last_event(checkout_id, caller)
            saga = await service.seen(caller, checkout_id)
            if first is not None:
                yield await _event(service, caller, saga, first.seq, first.state, first.at)
                last = first.seq
                if first.state in domain.TERMINAL:
                    return
        while True:
            changed.clear()  # cleared before the read: a change committed during it sets it again
            events = await sagas.events_after(checkout_id, last, caller)
            if events:
                saga = await service.seen(caller, checkout_id)
                for e in events:
                    yield await _event(service, caller, saga, e.seq, e.state, e.at)
                    last = e.seq
                    if e.state in domain.TERMINAL:
                        return
            timeout = None if warn_at is None else max(0.0, warn_at - loop.time())
            try:
                await asyncio.wait_for(changed.wait(), timeout)
            except asyncio.TimeoutError:
                warn_at = None  # once per stream
                saga = await service.seen(caller, checkout_id)
                if saga.state in _HOLDING and saga.expire_time is not None and saga.expire_time > saga.read_at:
                    yield await _event(service, caller, saga, last, saga.state, saga.read_at, kind=HOLD_EXPIRING)


async def _event(service, caller: Principal, saga, seq: int, state: str, at, *,
                 kind: str | None = None) -> checkout_pb2.CheckoutEvent:
    view = views.checkout_pb(await service.view_for(caller, saga))
    view.state = checkout_pb2.CheckoutState.Value(views.STATE_PREFIX + state)
    return checkout_pb2.CheckoutEvent(id=seq, type=kind or event_type(state), checkout=view, time=to_timestamp(at))
