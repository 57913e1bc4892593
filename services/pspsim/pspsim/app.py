"""HTTP API of the PSP simulator (Starlette)."""

from __future__ import annotations

import contextlib
import html
import json
import logging
import urllib.parse
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from . import lists
from .psp import Psp
from .scenarios import SCENARIOS
from .validation import ApiError, invalid
from .settings import Settings

log = logging.getLogger("pspsim.app")

MAX_BODY_BYTES = 64 * 1024


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise invalid("invalid_json", "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise invalid("invalid_json", "the request body must be a JSON object")
    return data


def _psp(request: Request) -> Psp:
    return request.app.state.psp


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def create_intent(request: Request) -> JSONResponse:
    body = await _json_body(request)
    intent = await _psp(request).create_intent(request.headers.get("Idempotency-Key"), body,
                                               traceparent=request.headers.get("traceparent"))
    return JSONResponse(intent)


async def get_intent(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).get_intent(request.path_params["intent_id"]))


async def cancel_intent(request: Request) -> JSONResponse:
    body = await _json_body(request)
    return JSONResponse(_psp(request).cancel_intent(request.path_params["intent_id"], body))


async def complete_3ds(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).complete_action(request.path_params["intent_id"], succeed=True))


async def fail_3ds(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).complete_action(request.path_params["intent_id"], succeed=False))


async def hosted_page(request: Request) -> HTMLResponse:
    """A payment link's page: the amount and a form where the customer presents a (test) card."""
    intent = _psp(request).hosted_intent(request.path_params["intent_id"])
    options = "".join(f'<option value="{html.escape(pm)}">{html.escape(pm)}</option>' for pm in SCENARIOS)
    amount = f"{intent.amount} {html.escape(intent.currency)} (minor units)"
    consent = ""
    if intent.off_session_consent:  # a later off-session charge the merchant asks consent to (a no-show fee)
        fee = intent.off_session_consent["amount"]
        consent = (f'<p><label><input type="checkbox" name="accept_off_session_amount" value="{fee}"> '
                   f"I accept that if I do not come, this card may be charged {fee} "
                   f"{html.escape(intent.currency)} (minor units) once, without asking me again "
                   "(the merchant's no-show fee).</label></p>")
    body = (f"<!doctype html><title>Pay {amount}</title><h1>Pay {amount}</h1>"
            f"<p>Status: {html.escape(intent.status)}</p>"
            f'<form method="post"><label>Card <select name="payment_method">{options}</select></label>'
            f'{consent}<button type="submit">Pay</button></form>')
    return HTMLResponse(body)


async def pay_on_page(request: Request) -> JSONResponse:
    """The hosted page's form (urlencoded) or a JSON body: `payment_method`, the customer's card."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise invalid("body_too_large", f"the body must be at most {MAX_BODY_BYTES} bytes")
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await _json_body(request)
    else:
        body = {k: v[0] for k, v in urllib.parse.parse_qs(raw.decode("utf-8", "replace")).items()}
    if "payment_method" not in body:
        raise invalid("parameter_missing", "payment_method is required", "payment_method")
    accept = body.get("accept_off_session_amount")
    if isinstance(accept, str):  # the form's checkbox sends the amount as text
        accept = int(accept) if accept.isascii() and accept.isdigit() and len(accept) <= 18 else accept
    if accept is not None and (isinstance(accept, bool) or not isinstance(accept, int) or accept <= 0):
        raise invalid("parameter_invalid_integer", "accept_off_session_amount must be the positive amount the "
                                                   f"page names, got {accept!r}", "accept_off_session_amount")
    return JSONResponse(await _psp(request).pay_on_page(request.path_params["intent_id"], body["payment_method"],
                                                        accept))


async def create_refund(request: Request) -> JSONResponse:
    body = await _json_body(request)
    return JSONResponse(_psp(request).create_refund(request.headers.get("Idempotency-Key"), body))


async def get_refund(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).get_refund(request.path_params["refund_id"]))


async def ledger(request: Request) -> JSONResponse:
    return JSONResponse({**_psp(request).store.ledger(), "disputes": _psp(request).disputes.ledger()})


async def events(request: Request) -> JSONResponse:
    return JSONResponse({"events": _psp(request).webhooks.snapshot()})


async def open_dispute(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).disputes.open(await _json_body(request)))


async def close_dispute(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).disputes.close(request.path_params["dispute_id"], await _json_body(request)))


async def get_dispute(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).disputes.get(request.path_params["dispute_id"]))


async def submit_dispute(request: Request) -> JSONResponse:
    return JSONResponse(_psp(request).disputes.submit(request.path_params["dispute_id"], await _json_body(request)))


async def list_charges(request: Request) -> JSONResponse:
    return JSONResponse(lists.charges(_psp(request), request.query_params))


async def list_refunds(request: Request) -> JSONResponse:
    return JSONResponse(lists.refunds(_psp(request), request.query_params))


async def balance_report(request: Request) -> JSONResponse:
    return JSONResponse(lists.balance_report(_psp(request), request.query_params))


async def list_disputes(request: Request) -> JSONResponse:
    return JSONResponse(lists.disputes(_psp(request), request.query_params))


async def faults(request: Request) -> JSONResponse:
    if request.method == "GET":
        return JSONResponse(_psp(request).faults())
    return JSONResponse(_psp(request).set_faults(await _json_body(request)))


async def reset(request: Request) -> JSONResponse:
    _psp(request).reset()
    return JSONResponse({"status": "reset"})


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = {404: "route_missing", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status_code, "http_error")
    return JSONResponse({"error": {"type": "invalid_request_error", "code": code, "message": str(exc.detail)}},
                        status_code=exc.status_code, headers=exc.headers)


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings.from_env()
    psp = Psp(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await psp.start()
        log.info("listening", extra={"url": settings.base_url, "webhook_url": settings.webhook_url})
        try:
            yield
        finally:
            await psp.aclose()
            log.info("stopped")

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/v1/payment_intents", create_intent, methods=["POST"]),
        Route("/v1/payment_intents/{intent_id}", get_intent, methods=["GET"]),
        Route("/v1/payment_intents/{intent_id}/cancel", cancel_intent, methods=["POST"]),
        Route("/3ds/{intent_id}/complete", complete_3ds, methods=["GET", "POST"]),
        Route("/3ds/{intent_id}/fail", fail_3ds, methods=["GET", "POST"]),
        Route("/pay/{intent_id}", hosted_page, methods=["GET"]),
        Route("/pay/{intent_id}", pay_on_page, methods=["POST"]),
        Route("/v1/refunds", create_refund, methods=["POST"]),
        Route("/v1/refunds", list_refunds, methods=["GET"]),
        Route("/v1/charges", list_charges, methods=["GET"]),
        Route("/v1/balance_report", balance_report, methods=["GET"]),
        Route("/v1/disputes", list_disputes, methods=["GET"]),
        Route("/v1/refunds/{refund_id}", get_refund, methods=["GET"]),
        Route("/v1/disputes/{dispute_id}", get_dispute, methods=["GET"]),
        Route("/v1/disputes/{dispute_id}", submit_dispute, methods=["POST"]),
        Route("/v1/_disputes", open_dispute, methods=["POST"]),
        Route("/v1/_disputes/{dispute_id}/close", close_dispute, methods=["POST"]),
        Route("/v1/_ledger", ledger, methods=["GET"]),
        Route("/v1/_events", events, methods=["GET"]),
        Route("/v1/_faults", faults, methods=["GET", "POST"]),
        Route("/v1/_reset", reset, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
        max_body_size=MAX_BODY_BYTES,
    )
    app.state.psp = psp
    app.state.settings = settings
    return app
