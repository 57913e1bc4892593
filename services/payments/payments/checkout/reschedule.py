"""The reschedule leg of a checkout: a COMPLETED booking moved to another slot of its salon
(docs/checkout.md, "Reschedule"). Its state on the saga row (`Reschedule`, the checkouts table's
reschedule_* columns), what its steps learn (`Learned`), and its rules; no I/O. The leg's states,
steps and routing are the saga's (domain.py), its steps' remote calls are steps.py's."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from cutylib.errors import FailedPrecondition


def _str(value: Any) -> str | None:
    return None if value is None else str(value)  # uuid columns arrive as UUID


@dataclass(frozen=True)
class Reschedule:
    """The reschedule under way (or the last one) of a checkout."""
    seq: int = 0                          # its number: each step's key carries it (domain.reschedule_key)
    count: int = 0                        # reschedules done
    status: str | None = None             # None: never rescheduled
    slot_id: str | None = None            # the new slot
    from_slot_id: str | None = None       # the slot it started from
    from_amount_minor: int | None = None  # what had been paid when it started
    hold_id: str | None = None            # the new slot's hold
    amount_minor: int | None = None       # the new slot's price, as held
    start_time: datetime | None = None
    expire_time: datetime | None = None   # the new hold's
    payment_method: str | None = None     # what pays a price increase
    payment_id: str | None = None         # the increase's payment
    by: str | None = None                 # who started it ("<role>:<subject>")
    failure: str = ""                     # why it was undone ('' : it was not)

    @property
    def difference(self) -> int | None:
        """The new slot's price minus what was paid (> 0 charged, < 0 refunded); None before the new hold."""
        if self.amount_minor is None:
            return None
        return self.amount_minor - (self.from_amount_minor or 0)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Reschedule":
        return cls(
            seq=row.get("reschedule_seq") or 0, count=row.get("reschedules") or 0,
            status=row.get("reschedule_status"), slot_id=_str(row.get("reschedule_slot_id")),
            from_slot_id=_str(row.get("reschedule_from_slot_id")),
            from_amount_minor=row.get("reschedule_from_amount_minor"), hold_id=row.get("reschedule_hold_id"),
            amount_minor=row.get("reschedule_amount_minor"), start_time=row.get("reschedule_start_time"),
            expire_time=row.get("reschedule_expire_time"), payment_method=row.get("reschedule_payment_method"),
            payment_id=_str(row.get("reschedule_payment_id")), by=row.get("rescheduled_by"),
            failure=row.get("reschedule_failure") or "")


@dataclass(frozen=True)
class Learned:
    """What a reschedule's steps learn, recorded with their move (Sagas.transition)."""
    hold_id: str | None = None
    amount_minor: int | None = None
    start_time: datetime | None = None
    expire_time: datetime | None = None
    payment_id: str | None = None


def initiator_role(rescheduled_by: str | None) -> str:
    """The role of who started a reschedule, from its `rescheduled_by` ("<role>:<subject>"); "" when
    unknown, which is never the customer."""
    return (rescheduled_by or "").split(":", 1)[0]


def refuse_unasked_charge(role: str, *, new_minor: int, paid_minor: int, currency: str | None) -> None:
    """A payment method is never reused for an action its customer did not start. A reschedule
    charges a price increase to the purchase's card without asking the customer again, so only the
    customer's own reschedule may go to a dearer slot; staff, admins (and anyone else) move a
    booking to a slot of the same or a lower price (a decrease is refunded). Checked when the request
    comes (the slot's price) and again by the step that would charge (the held price)."""
    if new_minor > paid_minor and role != "customer":
        raise FailedPrecondition(
            f"the new slot costs {new_minor} {currency or ''} minor units, more than the {paid_minor} "
            f"{currency or ''} paid; only the customer can move the booking to a dearer slot (the difference "
            "would be charged to their card): choose a slot of the same or a lower price",
            reason="reschedule-costs-more")
