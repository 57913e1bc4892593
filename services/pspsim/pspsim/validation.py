"""Request validation and the error answer shared by every route."""

from __future__ import annotations

from typing import Any

from .scenarios import SCENARIOS

MAX_AMOUNT = 10**12
MAX_KEY_LENGTH = 255
# payment_method_collection: the customer presents the card on the PSP's hosted page.
HOSTED_PAGE = "hosted_page"
# setup_future_usage / off_session: the card is saved for charges made without the customer.
OFF_SESSION = "off_session"
SAVED_PREFIX = "pm_saved_"
CUSTOMER_PREFIX = "cus_"


class ApiError(Exception):
    """An error answer: ``{"error": {"type", "code", "message", "param"?, ...extra}}``."""

    def __init__(self, status: int, type_: str, code: str, message: str, *,
                 param: str | None = None, **extra: Any):
        super().__init__(message)
        self.status = status
        self.error: dict[str, Any] = {"type": type_, "code": code, "message": message}
        if param is not None:
            self.error["param"] = param
        self.error.update(extra)

    def body(self) -> dict[str, Any]:
        return {"error": self.error}


def invalid(code: str, message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request_error", code, message, param=param)


def require_key(key: str | None) -> str:
    if key is None or not key.strip():
        raise invalid("idempotency_key_missing", "the Idempotency-Key header is required")
    if len(key) > MAX_KEY_LENGTH:
        raise invalid("idempotency_key_invalid",
                      f"Idempotency-Key must be at most {MAX_KEY_LENGTH} characters, got {len(key)}")
    return key


def check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    for name in body:
        if name not in allowed:
            raise invalid("parameter_unknown", f"unknown parameter {name!r}; expected one of {sorted(allowed)}", name)


def _positive_int(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_AMOUNT:
        raise invalid("parameter_invalid_integer",
                      f"{param} must be a positive integer in minor units, got {value!r}", param)
    return value


def _metadata(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid("parameter_invalid", f"metadata must be an object, got {type(value).__name__}", "metadata")
    return value


def validate_intent(body: dict[str, Any]) -> dict[str, Any]:
    """A create: a test payment method, or none with `payment_method_collection: "hosted_page"` (the
    customer presents one on the hosted page: a payment link)."""
    check_fields(body, {"amount", "currency", "payment_method", "payment_method_collection", "metadata",
                        "setup_future_usage", "off_session", "customer", "off_session_consent"})
    setup = body.get("setup_future_usage")
    if setup is not None and setup != OFF_SESSION:
        raise invalid("parameter_invalid", f"setup_future_usage must be {OFF_SESSION!r}, got {setup!r}",
                      "setup_future_usage")
    off_session = body.get("off_session", False)
    if not isinstance(off_session, bool):
        raise invalid("parameter_invalid", f"off_session must be a boolean, got {off_session!r}", "off_session")
    if off_session:
        return _validate_off_session(body, setup)
    if "customer" in body:
        raise invalid("parameter_invalid", "customer is given with off_session only (a setup makes its own)", "customer")
    collection = body.get("payment_method_collection")
    if collection is not None and collection != HOSTED_PAGE:
        raise invalid("parameter_invalid", f"payment_method_collection must be {HOSTED_PAGE!r}, got {collection!r}",
                      "payment_method_collection")
    required = ("amount", "currency") if collection else ("amount", "currency", "payment_method")
    for name in required:
        if name not in body:
            raise invalid("parameter_missing", f"{name} is required", name)
    if collection and "payment_method" in body:
        raise invalid("parameter_invalid", "payment_method is chosen by the customer on the hosted page, "
                                           "not given with payment_method_collection", "payment_method")
    currency = body["currency"]
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isascii() and currency.isalpha()):
        raise invalid("parameter_invalid", f"currency must be a 3-letter ISO 4217 code, got {currency!r}", "currency")
    pm = "" if collection else require_payment_method(body["payment_method"])
    amount = _positive_int(body["amount"], "amount")
    return {
        "amount": amount,
        "currency": currency.upper(),
        "payment_method": pm,
        "metadata": _metadata(body.get("metadata")),
        "setup_future_usage": setup,
        "off_session_consent": _consent(body.get("off_session_consent"), collection, setup, amount),
    }


def _consent(value: Any, collection: Any, setup: Any, amount: int) -> int | None:
    """`off_session_consent: {"amount": N}`: the hosted page asks the customer to consent to one
    later off-session charge of N (at most the payment's amount, in its currency); the card is saved
    only if they do. Only with the hosted page, and instead of setup_future_usage (the customer
    decides there). The amount, or None."""
    if value is None:
        return None
    where = "off_session_consent"
    if collection != HOSTED_PAGE:
        raise invalid("parameter_invalid", f"{where} is asked on the hosted page: give payment_method_collection "
                                           f"{HOSTED_PAGE!r}", where)
    if setup is not None:
        raise invalid("parameter_invalid", f"{where} saves the card only if the customer consents: "
                                           "not with setup_future_usage", where)
    if not isinstance(value, dict) or set(value) != {"amount"}:
        raise invalid("parameter_invalid", f"{where} must be an object with 'amount' alone", where)
    consent = _positive_int(value["amount"], f"{where}.amount")
    if consent > amount:
        raise invalid("parameter_invalid", f"{where}.amount must be at most the payment's amount ({amount})",
                      f"{where}.amount")
    return consent


def _validate_off_session(body: dict[str, Any], setup: Any) -> dict[str, Any]:
    """A charge made without the customer: a payment method saved by an earlier intent's
    `setup_future_usage: "off_session"`, and the customer it was saved for."""
    if setup is not None or "payment_method_collection" in body:
        raise invalid("parameter_invalid", "an off_session charge uses a saved payment method: no setup_future_usage "
                                           "or payment_method_collection", "off_session")
    for name in ("amount", "currency", "payment_method", "customer"):
        if name not in body:
            raise invalid("parameter_missing", f"{name} is required with off_session", name)
    pm, customer = body["payment_method"], body["customer"]
    if not isinstance(pm, str) or not pm.startswith(SAVED_PREFIX) or len(pm) > 64:
        raise invalid("payment_method_unknown", f"an off_session payment_method must be a saved one "
                                                f"({SAVED_PREFIX}...), got {pm!r}", "payment_method")
    if not isinstance(customer, str) or not customer.startswith(CUSTOMER_PREFIX) or len(customer) > 64:
        raise invalid("parameter_invalid", f"customer must be a customer id ({CUSTOMER_PREFIX}...), got {customer!r}",
                      "customer")
    currency = body["currency"]
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isascii() and currency.isalpha()):
        raise invalid("parameter_invalid", f"currency must be a 3-letter ISO 4217 code, got {currency!r}", "currency")
    return {
        "amount": _positive_int(body["amount"], "amount"),
        "currency": currency.upper(),
        "payment_method": pm,
        "metadata": _metadata(body.get("metadata")),
        "off_session": True,
        "customer": customer,
    }


def require_payment_method(pm: Any) -> str:
    if not isinstance(pm, str) or pm not in SCENARIOS:
        raise invalid("payment_method_unknown",
                      f"payment_method must be one of {', '.join(SCENARIOS)}, got {pm!r}", "payment_method")
    return pm


def validate_refund(body: dict[str, Any]) -> dict[str, Any]:
    check_fields(body, {"payment_intent", "amount", "reason", "metadata"})
    pi = body.get("payment_intent")
    if not isinstance(pi, str) or not pi:
        raise invalid("parameter_missing", f"payment_intent must be an intent id, got {pi!r}", "payment_intent")
    amount = body.get("amount")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise invalid("parameter_invalid", f"reason must be a string, got {reason!r}", "reason")
    return {
        "payment_intent": pi,
        "amount": None if amount is None else _positive_int(amount, "amount"),
        "reason": reason,
        "metadata": _metadata(body.get("metadata")),
    }
