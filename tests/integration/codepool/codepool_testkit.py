"""Helpers shared by the code pool integration tests (imported by name: the folder is not a package)."""
from __future__ import annotations

import dataclasses
import secrets

from cuty.codepool.v1 import codepool_pb2 as pb
from cuty.common.v1 import common_pb2
from cutylib.config import Settings
from cutylib.testing.trust import user
from cutylib.testing.ids import new_id

# Every plaintext code a test makes carries MARKER, so test_codepool_zz_no_plaintext.py can search
# the whole database and every log line of the run for it.
MARKER = "PlAiNzQ"
ADMIN = user("admin-1", "admin")
STAFF = user("staff-1", "staff")


def customer(subject: str):
    return user(subject, "customer")


def make_codes(n: int, tag: str = "") -> list[str]:
    run = secrets.token_hex(4)
    return [f"{MARKER}-{tag}{run}-{i:07d}" for i in range(n)]

async def new_product(stub, price: int = 1999) -> str:
    p = await stub.CreateProduct(pb.CreateProductRequest(
        sku="sku-" + new_id()[:12], name="Gift card", price=common_pb2.Money(currency_code="TRY", amount_minor=price)),
        metadata=ADMIN)
    return p.id


async def stocked_product(stub, n: int) -> tuple[str, list[str]]:
    product_id = await new_product(stub)
    codes = make_codes(n)
    resp = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b-" + new_id(),
                                                                codes=codes), metadata=ADMIN)
    assert resp.accepted and resp.imported == n
    return product_id, codes


def reserve_request(product_id: str, quantity: int = 1, *, order_id: str | None = None,
                    customer_id: str | None = None) -> pb.ReserveCodesRequest:
    """A reservation by a fresh customer unless one is named (a customer has at most
    CUTY_MAX_ACTIVE_RESERVATIONS live reservations)."""
    order_id = order_id or "ord-" + new_id()
    customer_id = "cust-" + new_id() if customer_id is None else customer_id
    return pb.ReserveCodesRequest(order_id=order_id, order_item_id=order_id + "/1", product_id=product_id,
                                  quantity=quantity, customer_id=customer_id)


async def stock_of(stub, product_id: str) -> tuple[int, int, int]:
    s = await stub.GetStock(pb.GetStockRequest(product_id=product_id), metadata=STAFF)
    return s.available, s.reserved, s.delivered


def settings(**overrides) -> Settings:
    return dataclasses.replace(Settings(), **overrides)
