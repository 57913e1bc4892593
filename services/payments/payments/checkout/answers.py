"""What the checkout use cases answer (checkout/service.py), as values: the saga, its payment as last
read, and what the caller may see of them. checkout/views.py turns them into protos for the gRPC
API; the use cases never build a proto."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..views import PaymentView
from .domain import Saga


@dataclass(frozen=True)
class Diagnostics:
    """How a checkout's current step is doing, for staff (checkout/diagnostics.py)."""
    attempts: int
    last_error: str
    failing_since: datetime | None
    attention_from: str
    trace_id: str
    updated_at: datetime
    version: int


@dataclass(frozen=True)
class CheckoutAnswer:
    """One checkout as a caller is told it."""
    saga: Saga
    payment: PaymentView | None = None           # the payment as last read (None: none yet)
    codes: tuple[tuple[str, str], ...] = ()      # (code id, value): the owner of a completed purchase only
    for_buyer: bool = True                       # False: without the customer action (redirect URL, secret)
    diagnostics: Diagnostics | None = None       # staff only


@dataclass(frozen=True)
class CheckoutPage:
    """One page of a list: each checkout with its payment's status (None: no payment)."""
    checkouts: list[tuple[Saga, str | None]]
    next_page_token: str = ""
