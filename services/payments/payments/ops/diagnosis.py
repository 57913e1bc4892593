"""Where a checkout stands and what the on-call engineer should do, decided from the facts the
queries gathered alone (no I/O)."""
from __future__ import annotations

# What the step of each state does, in words an on-call engineer can act on.
STEP_OF_STATE = {
    "PENDING": "hold (booking.HoldSlot / codepool.ReserveCodes)",
    "HELD": "none: waiting for the customer to pay (until the hold expires)",
    "CHARGING": "charge (PSP payment intent), then reading the payment's outcome",
    "AWAITING_ACTION": "none: waiting for the customer's 3-D Secure (or the PSP's webhook)",
    "CONFIRMING": "confirm (booking.ConfirmHold / codepool.DeliverCodes)",
    "RELEASING": "cancel the PSP intent, then release the hold / reservation",
    "REFUNDING": "refund (PSP refund), then release the hold / reservation",
    "CANCELLING": "cancel after purchase: refund per the policy (PSP refund), then booking.CancelBooking",
    "RESCHEDULING": "reschedule: booking.HoldSlot of the new slot, then the PSP charge of a price increase",
    "RESCHEDULE_CONFIRMING": "reschedule: booking.ConfirmHold (new), booking.CancelBooking (old), refund a decrease",
    "RESCHEDULE_REVERTING": "reschedule undone: cancel / refund the difference's payment, booking.ReleaseHold (new)",
}

def diagnose(checkout: dict | None, payments: list[dict]) -> tuple[str, str]:
    """(the step that is failing or '' , one paragraph: where it stands and what to do)."""
    captured = [p for p in payments if p["status"] in ("succeeded", "partially_refunded", "refunded")]
    if checkout is None:
        if not payments:
            return "", "nothing found"
        p = payments[-1]
        return "", f"a payment without a checkout, {p['status']}; refund by hand only if it was taken in error"
    state, cid = checkout["state"], checkout["id"]
    attempts, error = checkout.get("attempts") or 0, checkout.get("last_error") or ""
    step = STEP_OF_STATE.get(checkout.get("attention_from") or state, "")
    failing = f"{step}: failed {attempts} time(s) in a row since {checkout.get('failing_since')}; " \
              f"last error: {error}" if attempts else ""
    if state == "COMPLETED":
        return "", "completed: paid and confirmed (booking confirmed / codes delivered)"
    if state == "REFUNDED":
        return "", "refunded: the customer was charged and the money was returned (see the refund in the timeline)"
    if state in ("FAILED", "EXPIRED", "CANCELLED", "REJECTED"):
        if any(p["status"] in ("succeeded", "partially_refunded") for p in captured):
            return "", (f"{state} but a payment is captured and not refunded: this breaks 'every capture ends as "
                        f"one completion or one refund'. Escalate; `ops refund <payment id> --by <you>` returns "
                        f"the money")
        return "", f"{state.lower()}: nothing was charged (or it was given back); no action needed"
    if state == "NEEDS_ATTENTION":
        return step, (f"NEEDS ATTENTION: the step '{step}' failed {attempts} times and stopped retrying; "
                      f"last error: {error}. Fix the cause, then `python -m payments ops retry {cid} --by <you>` "
                      f"(the saga repeats the step with the same idempotency key)."
                      + (" The customer has been charged." if captured else ""))
    if attempts:
        return step, (f"{state}, retrying by itself: {failing}."
                      + (" The customer has been charged and has no booking yet." if captured else "")
                      + " It moves to NEEDS_ATTENTION if it keeps failing (CUTY_SAGA_MAX_ATTEMPTS).")
    return "", f"{state}: in progress, no failure recorded; current step: {step or 'none'}"
