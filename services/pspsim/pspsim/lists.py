"""The list API, Stripe-like: what the PSP holds, in pages, for a platform that reconciles against
it (payments' invariant auditor and its poller of lost dispute webhooks).

- `GET /v1/charges?created[gte]=&created[lt]=&limit=&starting_after=`: the captured charges of a
  window of capture times (unix seconds, fractions allowed), oldest first, each with its intent,
  amount, what was refunded and what a lost dispute took back;
  With `bucket_count=&buckets=` (comma-separated) only the charges whose intent id falls in one of
  those buckets (cutylib.digests): the drill-down of a balance report bucket that disagreed;
- `GET /v1/balance_report?created[gte]=&created[lt]=&bucket_count=`: the captured charges of a
  window summed, as a PSP's balance (settlement) report of a period: per non-empty bucket of the
  intent id's hash a count and the sum modulo 2^64 of each charge's fingerprint of (intent, amount,
  amount refunded) (cutylib.digests, the scheme payments sums its own side with in SQL), and the
  totals per currency. A window is at most MAX_REPORT_SECONDS, at most MAX_REPORT_BUCKETS buckets;
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

from cutylib import digests

from .validation import ApiError, invalid

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_REPORT_SECONDS = 86400.0  # a balance report's window: at most a day
MAX_REPORT_BUCKETS = 4096  # its answer: at most this many buckets (about 300 KB)
MAX_FILTER_BUCKETS = 1024  # a charges list's bucket filter (the query string stays under 8 KB)


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


def _bucket_count(params, required: bool, most: int) -> int:
    raw = params.get("bucket_count")
    if raw is None and not required:
        return 0
    if raw is None or not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not 1 <= int(raw) <= most:
        raise invalid("parameter_invalid_integer", f"bucket_count must be 1..{most}", "bucket_count")
    return int(raw)


def _buckets(params) -> tuple[int, frozenset[int] | None]:
    """A charges list's bucket filter: (bucket_count, the buckets), or (0, None) for none."""
    count = _bucket_count(params, False, digests.MAX_BUCKETS)
    raw = params.get("buckets")
    if not count:
        if raw is not None:
            raise invalid("parameter_missing", "bucket_count is required with buckets", "bucket_count")
        return 0, None
    parts = (raw or "").split(",")
    if not raw or not all(p.isascii() and p.isdigit() and len(p) <= 9 and int(p) < count for p in parts):
        raise invalid("parameter_invalid", "buckets must be comma-separated numbers below bucket_count", "buckets")
    if len(parts) > MAX_FILTER_BUCKETS:
        raise invalid("parameter_invalid", f"at most {MAX_FILTER_BUCKETS} buckets", "buckets")
    return count, frozenset(int(p) for p in parts)


def charges(psp, params) -> dict[str, Any]:
    _check(params, {"created[gte]", "created[lt]", "limit", "starting_after", "bucket_count", "buckets"})
    gte, lt = _number(params, "created[gte]", 0.0), _number(params, "created[lt]", math.inf)
    limit = _limit(params)
    count, chosen = _buckets(params)
    store = psp.store
    lost = psp.disputes.lost_by_intent()
    out = []
    i = _start(store.charge_times, store.charge_index, gte, params.get("starting_after"))
    while i < len(store.charges) and len(out) <= limit:
        c = store.charges[i]
        if c["at"] >= lt:
            break
        if chosen is not None and c["key"] % count not in chosen:
            i += 1
            continue
        intent = store.intents[c["intent_id"]]
        out.append({"id": c["id"], "object": "charge", "payment_intent": intent.id, "amount": intent.amount,
                    "amount_refunded": intent.amount_refunded, "amount_disputed_lost": lost.get(intent.id, 0),
                    "currency": intent.currency, "created": c["at"], "metadata": intent.metadata})
        i += 1
    return _page(out, limit)


def balance_report(psp, params) -> dict[str, Any]:
    _check(params, {"created[gte]", "created[lt]", "bucket_count"})
    for name in ("created[gte]", "created[lt]"):
        if name not in params:
            raise invalid("parameter_missing", f"{name} is required", name)
    gte, lt = _number(params, "created[gte]", 0.0), _number(params, "created[lt]", 0.0)
    if not gte < lt <= gte + MAX_REPORT_SECONDS:
        raise invalid("parameter_invalid", f"created[lt] must be after created[gte], at most {MAX_REPORT_SECONDS:.0f} "
                      "seconds after it", "created[lt]")
    count = _bucket_count(params, True, MAX_REPORT_BUCKETS)
    store = psp.store
    sums: dict[int, list[int]] = {}
    totals: dict[str, dict[str, int]] = {}
    i = bisect.bisect_left(store.charge_times, gte)
    end = bisect.bisect_left(store.charge_times, lt)
    for c in store.charges[i:end]:  # bounded by the window: a day of charges at most
        s = sums.setdefault(c["key"] % count, [0, 0])
        s[0] += 1
        s[1] += c["fact"]
        t = totals.setdefault(c["currency"], {"count": 0, "amount": 0, "amount_refunded": 0})
        t["count"] += 1
        t["amount"] += c["amount"]
        t["amount_refunded"] += c["refunded"]
    return {"object": "balance_report", "created": {"gte": gte, "lt": lt}, "bucket_count": count,
            "count": end - i, "totals": totals,
            "buckets": [{"bucket": b, "count": n, "fingerprint": f"{fp % digests.MOD:016x}"}
                        for b, (n, fp) in sorted(sums.items())]}


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
