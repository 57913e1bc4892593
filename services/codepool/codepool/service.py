"""Reservation use cases: reserve, deliver, release, read, expire ("Behaviour").

Each runs in one unit of work that rolls back unless committed, so a failure half-way leaves
nothing behind; the invariants themselves are enforced by the database (see repository.py).
"""
from __future__ import annotations

import logging

import asyncpg

from cutylib.config import Settings
from cutylib.db import UnitOfWork
from cutylib.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from cutylib.telemetry import set_span_attributes

from . import domain, metrics
from .domain import DELIVERED, RELEASED, ReservationView, ReserveCommand
from .repository import QUANTITY_CAP, SHORT_STOCK, TOO_MANY_RESERVATIONS, Reservations

log = logging.getLogger("codepool.reservations")


class OutOfStock(ResourceExhausted):
    """ReserveCodes refused: fewer codes are available than asked for. Carries the count; the gRPC
    API attaches it as the OutOfStock detail (errors are given their detail where they are
    translated to the wire, cutylib.errors)."""

    def __init__(self, product_id, requested: int, available: int):
        super().__init__(f"product {product_id} has {available} codes available, {requested} requested",
                         reason="out-of-stock")
        self.product_id, self.requested, self.available = product_id, requested, available


class InvariantBroken(RuntimeError):
    """The database answered something its constraints should have made impossible; roll back."""


class ReservationService:
    def __init__(self, pool: asyncpg.Pool, *, ttl_seconds: float,
                 max_active: int | None = None, max_quantity: int | None = None):
        self.pool = pool
        self.ttl_seconds = ttl_seconds
        defaults = Settings()
        self.max_active = defaults.max_active_reservations if max_active is None else max_active
        self.max_quantity = defaults.max_quantity_per_product if max_quantity is None else max_quantity

    async def reserve(self, cmd: ReserveCommand, actor: str) -> ReservationView:
        set_span_attributes(order_id=cmd.order_id, product_id=str(cmd.product_id))
        # One statement is its own unit of work (autocommit): it commits whole or not at all.
        repo = Reservations(self.pool)  # type: ignore[arg-type] - a pool runs single statements
        try:
            row = await repo.reserve(cmd, self.ttl_seconds, actor, max_active=self.max_active,
                                     max_quantity=self.max_quantity)
        except asyncpg.PostgresError as e:
            sqlstate = getattr(e, "sqlstate", None)
            if sqlstate in (TOO_MANY_RESERVATIONS, QUANTITY_CAP):
                raise self._capped(cmd, sqlstate) from None
            if sqlstate != SHORT_STOCK:
                raise
            available = await repo.count_available(cmd.product_id)
            metrics.REGISTRY.reservations.labels("out_of_stock").inc()
            raise OutOfStock(cmd.product_id, cmd.quantity, available) from None
        if row is None:
            return await self._replay(repo, cmd)
        metrics.REGISTRY.reservations.labels("reserved").inc()
        metrics.REGISTRY.codes_reserved.inc(cmd.quantity)
        log.info("codes reserved", extra={"order_id": cmd.order_id, "product_id": str(cmd.product_id),
                                          "quantity": cmd.quantity})
        return ReservationView.from_row(row, row["code_ids"])

    def _capped(self, cmd: ReserveCommand, sqlstate: str) -> ResourceExhausted:
        metrics.REGISTRY.reservations.labels("capped").inc()
        log.info("reservation capped", extra={"customer_id": cmd.customer_id, "product_id": str(cmd.product_id),
                                              "quantity": cmd.quantity, "cap": sqlstate})
        if sqlstate == TOO_MANY_RESERVATIONS:
            return ResourceExhausted(
                f"customer has {self.max_active} live code reservations already (the most allowed); "
                "pay for or cancel one first", reason="too-many-active-reservations")
        return ResourceExhausted(
            f"at most {self.max_quantity} codes of one product may be reserved by a customer at once, "
            f"{cmd.quantity} more requested", reason="quantity-limit")

    async def _replay(self, repo: Reservations, cmd: ReserveCommand) -> ReservationView:
        """RESERVE inserted nothing: this order item was reserved before (return it as it is now),
        another request holds the order or item id, or the product does not exist."""
        row = await repo.find_collision(cmd.order_id, cmd.order_item_id, cmd.product_id)
        if row is not None:
            if cmd.same_request(row):
                return ReservationView.from_row(row, row["code_ids"])
            raise FailedPrecondition(
                f"order {row['order_id']} / item {row['order_item_id']} is already reserved with other "
                f"parameters (product {row['product_id']}, quantity {row['quantity']})", reason="reservation-mismatch")
        if not await repo.product_exists(cmd.product_id):
            raise InvalidArgument("product_id", f"unknown product {cmd.product_id}")
        raise InvariantBroken(f"reservation of order {cmd.order_id} neither inserted nor found")

    async def deliver(self, order_id: str, transaction_id: str, actor: str) -> ReservationView:
        """Deliver the order's codes for a captured payment; idempotent on the transaction id."""
        set_span_attributes(order_id=order_id)
        rejection: FailedPrecondition | None = None
        async with UnitOfWork(self.pool) as uow:
            repo = Reservations(uow.conn)
            # Lock the order first: every writer of an order (deliver, release, sweeper) takes this
            # lock before anything else, so they serialise and never deadlock.
            res = await repo.lock(order_id)
            if res is None:
                return await self._deliver_moved(repo, order_id, transaction_id)
            if not await repo.claim_transaction(transaction_id, order_id):
                return await self._replay_transaction(repo, res, transaction_id)
            if res["status"] == DELIVERED:
                rejection = FailedPrecondition(
                    f"order {order_id} was already delivered under payment transaction {res['payment_transaction_id']}",
                    reason="order-already-delivered")
            elif res["status"] == RELEASED:
                rejection = await self._reopen(uow, repo, res, actor)
            if rejection is None:
                counts = await repo.deliver(order_id, transaction_id, actor, res["merchant_id"])
                if not counts["deliveries"] == counts["codes"] == counts["quantity"] == res["quantity"]:
                    raise InvariantBroken(f"order {order_id}: delivered {dict(counts)} of {res['quantity']}")
            else:
                await repo.reject_transaction(transaction_id, rejection.reason, res["merchant_id"])
                await repo.audit(actor, "deliver_rejected", product_id=res["product_id"], order_id=order_id,
                                 details={"payment_transaction_id": transaction_id, "reason": rejection.reason})
            # Read back before the commit: the answer describes this call's effect, not a later writer's.
            row = await repo.get(order_id)
            await uow.commit()
        if rejection is not None:
            metrics.REGISTRY.deliveries.labels("refused").inc()
            log.warning("delivery refused", extra={"order_id": order_id, "reason": rejection.reason})
            raise rejection
        metrics.REGISTRY.deliveries.labels("delivered").inc()
        metrics.REGISTRY.codes_delivered.inc(res["quantity"])
        log.info("codes delivered", extra={"order_id": order_id, "quantity": res["quantity"]})
        return ReservationView.from_row(row, row["code_ids"])

    async def _reopen(self, uow: UnitOfWork, repo: Reservations, res, actor: str) -> FailedPrecondition | None:
        """The reservation expired or was released before the payment arrived: take fresh codes if
        the stock allows (savepoint: a short take leaves nothing), else refuse so the orchestrator refunds."""
        try:
            async with uow.savepoint():
                await repo.reopen(res["order_id"], self.ttl_seconds)
                code_ids = await repo.take_codes(res)
                if len(code_ids) < res["quantity"]:
                    raise _Short()
                await repo.audit(actor, "reserve", product_id=res["product_id"], order_id=res["order_id"],
                                 code_ids=code_ids, details={"quantity": res["quantity"], "reopened": True})
        except _Short:
            # the savepoint is rolled back, so the codes just taken count as available again
            available = await repo.count_available(res["product_id"])
            return FailedPrecondition(
                f"reservation of order {res['order_id']} lapsed and only {available} codes are available "
                f"for the {res['quantity']} ordered", reason="reservation-lost")
        return None

    async def _deliver_moved(self, repo: Reservations, order_id: str, transaction_id: str) -> ReservationView:
        """DeliverCodes of an order that finished long ago and moved into the order history (or of
        none): answered as the live order would have answered, writing nothing (a moved order is
        read-only). A replay of its transaction gets the delivery or the same refusal; another
        payment is refused like one for a finished live order."""
        moved = await repo.get_moved(order_id)
        if moved is None:
            raise NotFound(f"no reservation for order {order_id}")
        if await repo.get_any_transaction(transaction_id, moved["merchant_id"]) is not None:
            return await self._replay_transaction(repo, moved, transaction_id, row=moved)
        if moved["status"] == DELIVERED:
            raise FailedPrecondition(
                f"order {order_id} was already delivered under payment transaction {moved['payment_transaction_id']}",
                reason="order-already-delivered")
        raise FailedPrecondition(f"reservation of order {order_id} lapsed long ago (moved into the order history)",
                                 reason="reservation-lost")

    async def _replay_transaction(self, repo: Reservations, res, transaction_id: str, *,
                                  row=None) -> ReservationView:
        order_id = res["order_id"]
        find = repo.get_transaction if row is None else repo.get_any_transaction
        stored = await find(transaction_id, res["merchant_id"])
        if stored["order_id"] != order_id:
            raise FailedPrecondition(f"payment transaction {transaction_id} belongs to order {stored['order_id']}",
                                     reason="transaction-order-mismatch")
        if stored["outcome"] == "rejected":
            raise FailedPrecondition(f"payment transaction {transaction_id} was refused for order {order_id}: "
                                     f"{stored['reason']}", reason=stored["reason"])
        row = row or await repo.get(order_id)
        return ReservationView.from_row(row, row["code_ids"])

    async def release(self, order_id: str, actor: str) -> ReservationView:
        """Put a reserved order's codes back in stock; releasing again returns the released order."""
        set_span_attributes(order_id=order_id)
        async with UnitOfWork(self.pool) as uow:
            repo = Reservations(uow.conn)
            res = await repo.lock(order_id) or await repo.get_moved(order_id)
            if res is None:
                raise NotFound(f"no reservation for order {order_id}")
            if res["status"] == DELIVERED:
                raise FailedPrecondition(f"order {order_id} is delivered; delivered codes cannot be released",
                                         reason="order-delivered")
            if res["status"] == domain.RESERVED:
                counts = await repo.release([order_id], "released", actor)
                if counts["deliveries"] != counts["codes"] or counts["reservations"] != 1:
                    raise InvariantBroken(f"order {order_id}: released {dict(counts)}")
            # a released order that moved into the history answers as it was
            row = res if "moved_at" in res.keys() else await repo.get(order_id)
            await uow.commit()
        return ReservationView.from_row(row, row["code_ids"])

    async def expire_due(self, limit: int, actor: str = "system:sweeper") -> int:
        """Release up to `limit` reservations past their TTL. Safe with any number of replicas:
        SKIP LOCKED gives each its own rows, and RELEASE only touches rows still reserved."""
        async with UnitOfWork(self.pool) as uow:
            repo = Reservations(uow.conn)
            order_ids = await repo.claim_expired(limit)
            if not order_ids:
                return 0
            counts = await repo.release(order_ids, "expired", actor)
            if counts["deliveries"] != counts["codes"]:
                raise InvariantBroken(f"expiry released {dict(counts)}")
            await uow.commit()
        metrics.REGISTRY.reservations_expired.inc(counts["reservations"])
        log.info("reservations expired", extra={"count": counts["reservations"], "codes": counts["codes"]})
        return counts["reservations"]


class _Short(Exception):
    """Fewer codes than ordered could be taken: undo the savepoint."""
