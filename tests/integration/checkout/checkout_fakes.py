"""In-memory stand-ins for booking and the code pool, for in-process saga tests (the PSP's is
cutylib.testing.fake_psp, shared with the payments tests).

They dedupe on the same keys the real services do, count every *effect* (a hold taken, a hold
confirmed, a charge...) so tests can assert "no step's effect happened twice", and can be told to
fail: `fail_next["ConfirmHold"] = ["UNAVAILABLE"]` answers UNAVAILABLE once without any effect;
"DEADLINE_EXCEEDED_AFTER" performs the effect and then loses the answer (the outcome is unknown
to the caller, as with a real deadline).
"""
from __future__ import annotations

import asyncio
import secrets
import uuid
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

import grpc
from google.protobuf import any_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2, status_pb2

from cuty.booking.v1 import booking_pb2
from cuty.codepool.v1 import codepool_pb2
from cuty.common.v1 import common_pb2
from cutylib.testing.trust import TEST_MERCHANT


def rpc_error(code: grpc.StatusCode, message: str, detail=None) -> grpc.aio.AioRpcError:
    st = status_pb2.Status(code=code.value[0], message=message)
    if detail is not None:
        a = any_pb2.Any()
        a.Pack(detail)
        st.details.append(a)
    md = grpc.aio.Metadata(("grpc-status-details-bin", st.SerializeToString()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), md, details=message)


def ts(dt: datetime) -> Timestamp:
    t = Timestamp()
    t.FromDatetime(dt)
    return t


def now() -> datetime:
    return datetime.now(timezone.utc)


# The salon of every fake slot unless add_slot names another.
FAKE_SALON = "5a10f000-0000-4000-8000-000000000001"


class Faults:
    def __init__(self):
        self.fail_next: dict[str, list[str]] = defaultdict(list)
        self.calls: Counter[str] = Counter()
        self.delay: dict[str, float] = {}

    async def enter(self, method: str) -> str | None:
        self.calls[method] += 1
        if self.delay.get(method):
            await asyncio.sleep(self.delay[method])
        if self.fail_next[method]:
            mode = self.fail_next[method].pop(0)
            if mode == "DEADLINE_EXCEEDED_AFTER":
                return mode
            raise rpc_error(getattr(grpc.StatusCode, mode), f"injected {mode}")
        return None

    @staticmethod
    def leave(mode: str | None) -> None:
        if mode == "DEADLINE_EXCEEDED_AFTER":
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "injected deadline after the effect")


class FakeBooking(Faults):
    """Slots with a price; one active hold per slot; HoldSlot idempotent on (customer, request_id)."""

    def __init__(self, hold_ttl: float = 300, extension: float = 300):
        super().__init__()
        self.hold_ttl = hold_ttl
        self.extension = extension
        self.slots: dict[str, int] = {}
        self.salon_of: dict[str, str] = {}  # slot -> salon (FAKE_SALON unless add_slot names one)
        self.merchant_of: dict[str, str] = {}  # slot -> merchant (TEST_MERCHANT unless add_slot names one)
        self.holds: dict[str, dict] = {}
        self.by_request: dict[tuple[str, str], str] = {}
        self.effects: Counter[str] = Counter()
        self.started: set[str] = set()  # slots whose appointment has started: never confirmed
        # Slot -> its start and its salon's cancellation policy (hours, fee %) at hold time.
        self.start_of: dict[str, datetime] = {}
        self.policy_of: dict[str, tuple[int, int]] = {}

    def add_slot(self, price: int = 15000, salon_id: str | None = None, merchant_id: str | None = None, *,
                 start: datetime | None = None, free_hours: int = 24, fee_percent: int = 0) -> str:
        sid = str(uuid.uuid4())
        self.slots[sid] = price
        if salon_id:
            self.salon_of[sid] = salon_id
        if merchant_id:
            self.merchant_of[sid] = merchant_id
        self.start_of[sid] = start or now() + timedelta(days=7)
        self.policy_of[sid] = (free_hours, fee_percent)
        return sid

    def _active(self, slot_id: str):
        for h in self.holds.values():
            if h["slot_id"] == slot_id and (h["status"] == "confirmed" or
                                            (h["status"] == "held" and h["expire"] > now())):
                return h
        return None

    def _msg(self, h) -> booking_pb2.Hold:
        status = {"held": booking_pb2.HOLD_STATUS_HELD, "confirmed": booking_pb2.HOLD_STATUS_CONFIRMED,
                  "released": booking_pb2.HOLD_STATUS_RELEASED}[h["status"]]
        if h["status"] == "held" and h["expire"] <= now():
            status = booking_pb2.HOLD_STATUS_EXPIRED
        return booking_pb2.Hold(id=h["id"], slot_id=h["slot_id"], customer_id=h["customer"], status=status,
                                expire_time=ts(h["expire"]), extended=h["extended"],
                                payment_ref=h.get("payment_ref", ""),
                                merchant_id=self.merchant_of.get(h["slot_id"], TEST_MERCHANT),
                                salon_id=self.salon_of.get(h["slot_id"], FAKE_SALON),
                                price=common_pb2.Money(currency_code="TRY", amount_minor=self.slots[h["slot_id"]]),
                                start_time=ts(self.start_of[h["slot_id"]]),
                                free_cancellation_hours=self.policy_of[h["slot_id"]][0],
                                cancellation_fee_percent=self.policy_of[h["slot_id"]][1])

    def take(self, slot_id: str, customer: str = "someone-else") -> None:
        """Another buyer takes the slot (only possible once our hold is inactive)."""
        assert self._active(slot_id) is None
        hid = str(uuid.uuid4())
        self.holds[hid] = {"id": hid, "slot_id": slot_id, "customer": customer, "status": "held",
                           "expire": now() + timedelta(hours=1), "extended": False}

    def expire(self, hold_id: str) -> None:
        self.holds[hold_id]["expire"] = now() - timedelta(seconds=1)

    async def HoldSlot(self, req, timeout=None):
        mode = await self.enter("HoldSlot")
        key = (req.customer_id, req.request_id)
        if key in self.by_request:
            self.leave(mode)
            return self._msg(self.holds[self.by_request[key]])
        if req.slot_id not in self.slots:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, f"slot {req.slot_id} not found")
        if self._active(req.slot_id):
            alt = booking_pb2.Slot(id=str(uuid.uuid4()))
            raise rpc_error(grpc.StatusCode.ALREADY_EXISTS, "slot taken",
                            booking_pb2.SlotUnavailable(slot_id=req.slot_id, alternatives=[alt]))
        hid = str(uuid.uuid4())
        self.holds[hid] = {"id": hid, "slot_id": req.slot_id, "customer": req.customer_id, "status": "held",
                           "expire": now() + timedelta(seconds=self.hold_ttl), "extended": False}
        self.by_request[key] = hid
        self.effects["hold"] += 1
        self.leave(mode)
        return self._msg(self.holds[hid])

    async def ExtendHold(self, req, timeout=None):
        mode = await self.enter("ExtendHold")
        h = self.holds[req.hold_id]
        if h["extended"] or h["status"] != "held" or h["expire"] <= now():
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "cannot extend")
        h["extended"] = True
        h["expire"] = h["expire"] + timedelta(seconds=self.extension)
        self.effects["extend"] += 1
        self.leave(mode)
        return self._msg(h)

    async def GetSlot(self, req, timeout=None):
        """A reschedule checks the new slot's salon first."""
        await self.enter("GetSlot")
        if req.slot_id not in self.slots:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, f"slot {req.slot_id} not found")
        return booking_pb2.Slot(id=req.slot_id, salon_id=self.salon_of.get(req.slot_id, FAKE_SALON),
                                price=common_pb2.Money(currency_code="TRY", amount_minor=self.slots[req.slot_id]))

    async def GetHold(self, req, timeout=None):
        await self.enter("GetHold")
        return self._msg(self.holds[req.hold_id])

    async def ConfirmHold(self, req, timeout=None):
        mode = await self.enter("ConfirmHold")
        h = self.holds[req.hold_id]
        if h["status"] == "confirmed":
            assert h["payment_ref"] == req.payment_ref
            self.leave(mode)
            return self._msg(h)
        if h["status"] != "held":
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "hold released")
        if h["slot_id"] in self.started:
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "the slot has started",
                            error_details_pb2.ErrorInfo(reason="slot-started"))
        if h["expire"] <= now():
            other = self._active(h["slot_id"])
            if other is not None and other is not h:
                raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "hold expired and the slot is taken")
            self.effects["re-hold"] += 1
        h["status"] = "confirmed"
        h["payment_ref"] = req.payment_ref
        self.effects["confirm"] += 1
        self.leave(mode)
        return self._msg(h)

    async def ReleaseHold(self, req, timeout=None):
        mode = await self.enter("ReleaseHold")
        h = self.holds[req.hold_id]
        if h["status"] == "confirmed":
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "hold is confirmed")
        if h["status"] == "held":
            h["status"] = "released"
            self.effects["release"] += 1
        self.leave(mode)
        return self._msg(h)

    async def CancelBooking(self, req, timeout=None):
        """A confirmed hold cancelled after purchase: released; idempotent on the payment ref."""
        mode = await self.enter("CancelBooking")
        h = self.holds[req.hold_id]
        if h["status"] == "confirmed" and h["payment_ref"] == req.payment_ref:
            h["status"], h["cancelled_ref"] = "released", h.pop("payment_ref")
            self.effects["cancel_booking"] += 1
        elif not (h["status"] == "released" and h.get("cancelled_ref") == req.payment_ref):
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"hold is {h['status']}, not a confirmed booking")
        self.leave(mode)
        return self._msg(h)

    def status_of(self, hold_id: str) -> str:
        return booking_pb2.HoldStatus.Name(self._msg(self.holds[hold_id]).status)


class FakeCodePool(Faults):
    def __init__(self, ttl: float = 900):
        super().__init__()
        self.ttl = ttl
        self.products: dict[str, dict] = {}
        self.orders: dict[str, dict] = {}
        self.effects: Counter[str] = Counter()

    def add_product(self, price: int = 2500, stock: int = 10, merchant_id: str = TEST_MERCHANT) -> str:
        pid = str(uuid.uuid4())
        self.products[pid] = {"price": price, "stock": [f"code-{secrets.token_hex(4)}" for _ in range(stock)],
                              "merchant": merchant_id}
        return pid

    def _msg(self, o) -> codepool_pb2.Reservation:
        st = {"reserved": codepool_pb2.RESERVATION_STATUS_RESERVED, "delivered": codepool_pb2.RESERVATION_STATUS_DELIVERED,
              "released": codepool_pb2.RESERVATION_STATUS_RELEASED}[o["status"]]
        p = self.products[o["product"]]
        return codepool_pb2.Reservation(order_id=o["id"], product_id=o["product"], customer_id=o["customer"],
                                        status=st, quantity=len(o["codes"]), expire_time=ts(o["expire"]),
                                        code_ids=o["codes"], payment_transaction_id=o.get("txn", ""),
                                        merchant_id=p.get("merchant", TEST_MERCHANT),
                                        unit_price=common_pb2.Money(currency_code="TRY", amount_minor=p["price"]))

    async def ReserveCodes(self, req, timeout=None):
        mode = await self.enter("ReserveCodes")
        if req.order_id in self.orders:
            self.leave(mode)
            return self._msg(self.orders[req.order_id])
        if req.product_id not in self.products:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, "no such product")
        p = self.products[req.product_id]
        if len(p["stock"]) < req.quantity:
            raise rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "out of stock",
                            codepool_pb2.OutOfStock(product_id=req.product_id, requested=req.quantity,
                                                    available=len(p["stock"])))
        codes, p["stock"] = p["stock"][:req.quantity], p["stock"][req.quantity:]
        self.orders[req.order_id] = {"id": req.order_id, "product": req.product_id, "customer": req.customer_id,
                                     "status": "reserved", "codes": codes,
                                     "expire": now() + timedelta(seconds=self.ttl)}
        self.effects["reserve"] += 1
        self.leave(mode)
        return self._msg(self.orders[req.order_id])

    async def DeliverCodes(self, req, timeout=None):
        mode = await self.enter("DeliverCodes")
        o = self.orders[req.order_id]
        if o["status"] == "delivered":
            assert o["txn"] == req.payment_transaction_id
        elif o["status"] != "reserved":
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "reservation released")
        else:
            o["status"], o["txn"] = "delivered", req.payment_transaction_id
            self.effects["deliver"] += 1
        self.leave(mode)
        return self._msg(o)

    async def ReleaseReservation(self, req, timeout=None):
        mode = await self.enter("ReleaseReservation")
        o = self.orders.get(req.order_id)
        if o is None:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, "no such order")
        if o["status"] == "delivered":
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "delivered")
        if o["status"] == "reserved":
            o["status"] = "released"
            self.products[o["product"]]["stock"].extend(o["codes"])
            self.effects["release"] += 1
        self.leave(mode)
        return self._msg(o)

    async def GetDeliveredCodes(self, req, timeout=None):
        await self.enter("GetDeliveredCodes")
        o = self.orders[req.order_id]
        if o["customer"] != req.customer_id or o["status"] != "delivered":
            raise rpc_error(grpc.StatusCode.NOT_FOUND, "no delivered codes")
        return codepool_pb2.DeliveredCodes(order_id=o["id"], codes=[
            codepool_pb2.PlainCode(id=f"id-{c}", value=c) for c in o["codes"]])
