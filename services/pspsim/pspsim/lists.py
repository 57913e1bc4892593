"""The list API, Stripe-like: what the PSP holds, in pages, for a platform that reconciles against
it (payments' invariant auditor and its poller of lost dispute webhooks).

- `GET /v1/charges?created[gte]=&created[lt]=&limit=&starting_after=`: the captured charges of a
  window of capture times (unix seconds, fractions allowed), oldest first, each with its intent,
  amount, what was refunded and what a lost dispute took back;
- `GET /v1/refunds?created[gte]=&created[lt]=&limit=&starting_after=`: the refunds of a window;
- `GET /v1/disputes?updated[gte]=&limit=&starting_after=`: the disputes changed at or after an
  instant (opened, answered, closed), in (updated, id) order: what a lost webhook did not bring.

Every answer is `{"object": "list", "data": [...], "has_more": bool}` with at most `limit` items
(1..1000, default 100); `starting_after` is the id of the last item of the previous page.
"""
from __future__ import annotations

import bisect
import math
from typing import Any

from .validation import ApiError, invalid

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def _number(params, name: str, default: float) -> float:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise invalid("parameter_invalid", f"{name} must be a unix time in seconds", name) from None
    if not math.isfinite(value) or value < 0:
        raise invalid("parameter_invalid", f"{name} must be a unix time in seconds", name)
    return value


def _limit(params) -> int:
    raw = params.get("limit", str(DEFAULT_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise invalid("parameter_invalid_integer", f"limit must be 1..{MAX_LIMIT}", "limit")
    return int(raw)


def _check(params, allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise invalid("parameter_unknown", f"unknown parameter: {unknown[0]}", unknown[0])


def _page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    return {"object": "list", "data": items[:limit], "has_more": len(items) > limit}


def _start(times: list[float], ids: dict[str, int], gte: float, after: str | None) -> int:
    """Where a window's page starts in a time-ordered list: after `after` (its position), else at
    the first item at or after `gte`."""
    if after:
        if after not in ids:
            raise ApiError(404, "invalid_request_error", "resource_missing", f"no such object: {after!r}",
                           param="starting_after")
        return max(ids[after] + 1, bisect.bisect_left(times, gte))
    return bisect.bisect_left(times, gte)


def charges(psp, params) -> dict[str, Any]:
    _check(params, {"created[gte]", "created[lt]", "limit", "starting_after"})
    gte, lt = _number(params, "created[gte]", 0.0), _number(params, "created[lt]", math.inf)
    limit = _limit(params)
    store = psp.store
    lost = psp.disputes.lost_by_intent()
    out = []
    i = _start(store.charge_times, store.charge_index, gte, params.get("starting_after"))
    while i < len(store.charges) and len(out) <= limit:
        c = store.charges[i]
        if c["at"] >= lt:
            break
        intent = store.intents[c["intent_id"]]
        out.append({"id": c["id"], "object": "charge", "payment_intent": intent.id, "amount": intent.amount,
                    "amount_refunded": intent.amount_refunded, "amount_disputed_lost": lost.get(intent.id, 0),
                    "currency": intent.currency, "created": c["at"], "metadata": intent.metadata})
        i += 1
    return _page(out, limit)


def refunds(psp, params) -> dict[str, Any]:
    _check(params, {"created[gte]", "created[lt]", "limit", "starting_after"})
    gte, lt = _number(params, "created[gte]", 0.0), _number(params, "created[lt]", math.inf)
    limit = _limit(params)
    store = psp.store
    out = []
    i = _start(store.refund_times, store.refund_index, gte, params.get("starting_after"))
    while i < len(store.refund_order) and len(out) <= limit:
        r = store.refunds[store.refund_order[i]]
        if store.refund_times[i] >= lt:
            break
        out.append({**r.snapshot(), "created": store.refund_times[i]})
        i += 1
    return _page(out, limit)


def disputes(psp, params) -> dict[str, Any]:
    _check(params, {"updated[gte]", "limit", "starting_after"})
    gte = _number(params, "updated[gte]", 0.0)
    limit = _limit(params)
    changed = sorted((d for d in psp.disputes.items.values() if d.updated >= gte), key=lambda d: (d.updated, d.id))
    after = params.get("starting_after")
    if after:
        keys = [d.id for d in changed]
        if after not in keys:
            raise ApiError(404, "invalid_request_error", "resource_missing", f"no such dispute: {after!r}",
                           param="starting_after")
        changed = changed[keys.index(after) + 1:]
    return _page([{**d.snapshot(), "updated": d.updated} for d in changed[:limit + 1]], limit)
