"""HTTP client of the PSP (Stripe-like payment intents; docs/pspsim.md).

Every call we make is idempotent (creates and refunds carry an Idempotency-Key, GET and cancel are
naturally so), so 5xx answers, connection errors and timeouts are retried with jittered backoff.
When the attempts run out the outcome is *unknown* (`PspUnavailable`), never "failed": the charge
may have happened, and reconciliation or a webhook will tell.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from opentelemetry import propagate, trace
from prometheus_client import REGISTRY, Histogram

from cutylib.metrics import DURATION_BUCKETS, observe
from cutylib.psp import PspError, PspUnavailable

__all__ = ["PspClient", "PspError", "PspUnavailable"]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("cuty.payments.psp")

# One observation per HTTP attempt (OpenTelemetry's http.client.request.duration); status "error"
# when no answer came (timeout, refused, reset).
PSP_DURATION = Histogram("http_client_request_duration_seconds", "Calls to the PSP, per attempt",
                         ("server_address", "http_request_method", "url_template", "http_response_status_code"),
                         buckets=DURATION_BUCKETS, registry=REGISTRY)


class PspClient:
    """The `cutylib.psp.Psp` calls over HTTP. One keep-alive aiohttp session per process (httpx +
    httpcore cost about ten times aiohttp's CPU per call under concurrency, docs/benchmarks.md),
    created on first use inside the running event loop."""

    def __init__(self, base_url: str, *, timeout: float = 3.0, retries: int = 2, backoff: float = 0.1,
                 max_connections: int = 100):
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        url = urlsplit(self.base_url)
        self._host, self._port = url.hostname, url.port or (443 if url.scheme == "https" else 80)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(limit=self._max_connections),
                json_serialize=json.dumps, skip_auto_headers=("User-Agent",))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def create_intent(self, idempotency_key: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", "/v1/payment_intents", body=body, key=idempotency_key)

    async def get_intent(self, intent_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/payment_intents/{intent_id}")

    async def cancel_intent(self, intent_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/payment_intents/{intent_id}/cancel", body={})

    async def create_refund(self, idempotency_key: str, intent_id: str, metadata: dict[str, str],
                            amount: int | None = None) -> dict[str, Any]:
        """Refund `amount` minor units of the intent (None: what is left). The same key and body
        answer the same refund; the PSP never refunds more than it captured."""
        body: dict[str, Any] = {"payment_intent": intent_id, "metadata": metadata}
        if amount is not None:
            body["amount"] = amount
        return await self._call("POST", "/v1/refunds", body=body, key=idempotency_key)

    async def get_dispute(self, dispute_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/disputes/{dispute_id}")

    async def submit_dispute_evidence(self, dispute_id: str, evidence: dict[str, Any]) -> dict[str, Any]:
        """Submit a dispute's evidence (docs/payments.md, "Disputes"); the same evidence again answers
        the dispute as it is (a retry)."""
        return await self._call("POST", f"/v1/disputes/{dispute_id}", body={"evidence": evidence, "submit": True})

    # -- the list API (pspsim/lists.py): what the PSP holds, paged, for the invariant auditor and the
    # dispute poller. `created`/`updated` are unix seconds; a page is at most `limit` items.
    async def list_charges(self, gte: float, lt: float, *, starting_after: str = "", limit: int = 1000,
                           bucket_count: int = 0, buckets: list[int] | None = None) -> dict:
        """A page of the charges captured in [gte, lt); with `bucket_count`, only those whose intent
        falls in one of `buckets` (cutylib.digests: a balance report's buckets that disagreed)."""
        drill = {"bucket_count": str(bucket_count), "buckets": ",".join(map(str, buckets or []))} if bucket_count else {}
        return await self._call("GET", "/v1/charges", params=_page_params(
            {"created[gte]": repr(gte), "created[lt]": repr(lt), **drill}, starting_after, limit))

    async def balance_report(self, gte: float, lt: float, bucket_count: int) -> dict:
        """The charges captured in [gte, lt) summed per bucket of the intent id's hash (pspsim's
        `GET /v1/balance_report`): what the auditor compares with payments' own sums."""
        return await self._call("GET", "/v1/balance_report", params={
            "created[gte]": repr(gte), "created[lt]": repr(lt), "bucket_count": str(bucket_count)})

    async def list_refunds(self, gte: float, lt: float, *, starting_after: str = "", limit: int = 1000) -> dict:
        return await self._call("GET", "/v1/refunds", params=_page_params(
            {"created[gte]": repr(gte), "created[lt]": repr(lt)}, starting_after, limit))

    async def list_disputes(self, updated_gte: float, *, starting_after: str = "", limit: int = 100) -> dict:
        return await self._call("GET", "/v1/disputes", params=_page_params(
            {"updated[gte]": repr(updated_gte)}, starting_after, limit))

    async def _call(self, method: str, path: str, *, body: dict | None = None, key: str | None = None,
                    params: dict[str, str] | None = None) -> dict:
        headers: dict[str, str] = {}
        if key is not None:
            headers["Idempotency-Key"] = key
        last = ""
        template = _url_template(path)
        # An HTTP client span (OpenTelemetry's HTTP conventions) in the caller's trace: the checkout's.
        with tracer.start_as_current_span(f"{method} {template}", kind=trace.SpanKind.CLIENT, attributes={
                "http.request.method": method, "url.template": template, "url.full": self.base_url + path,
                "server.address": self._host, "server.port": self._port}) as span:
            propagate.inject(headers)  # W3C traceparent, so the PSP call joins the trace
            for attempt in range(self.retries + 1):
                if attempt:
                    # Full jitter: replicas retrying the same outage do not stampede together.
                    await asyncio.sleep(random.uniform(0, self.backoff * 2 ** attempt))
                t0 = time.perf_counter()
                try:
                    async with self._http().request(method, self.base_url + path, json=body, headers=headers,
                                                    params=params) as resp:
                        status, raw = resp.status, await _read_capped(resp)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # timeouts, refused connections, resets
                    observe(PSP_DURATION.labels("psp", method, template, "error"), time.perf_counter() - t0)
                    last = f"{type(exc).__name__}: {exc}"
                    log.warning("PSP call failed, outcome unknown", extra={"path": path, "attempt": attempt, "error": last})
                    continue
                observe(PSP_DURATION.labels("psp", method, template, str(status)), time.perf_counter() - t0)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(trace.StatusCode.ERROR)
                if status < 300:
                    return json.loads(raw)
                if status >= 500 or status == 429:
                    last = f"HTTP {status}"
                    log.warning("PSP answered %s, retrying", status, extra={"path": path, "attempt": attempt})
                    continue
                try:
                    error = json.loads(raw).get("error") or {}
                except (ValueError, AttributeError):
                    error = {"message": raw[:200].decode("utf-8", "replace")}
                raise PspError(status, error)
            raise PspUnavailable(f"PSP {method} {path}: no answer after {self.retries + 1} attempts ({last})")


# The largest answer read from the PSP: a list page of 1,000 charges is about 400 KB.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


async def _read_capped(resp: aiohttp.ClientResponse) -> bytes:
    raw = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        raw += chunk
        if len(raw) > MAX_ANSWER_BYTES:
            raise PspError(502, {"code": "answer_too_large",
                                         "message": f"the PSP's answer exceeds {MAX_ANSWER_BYTES} bytes"})
    return bytes(raw)


def _page_params(params: dict[str, str], starting_after: str, limit: int) -> dict[str, str]:
    return {**params, "limit": str(limit), **({"starting_after": starting_after} if starting_after else {})}


def _url_template(path: str) -> str:
    """`/v1/payment_intents/pi_123/cancel` -> `/v1/payment_intents/{id}/cancel` (bounded labels)."""
    return "/".join("{id}" if part.startswith(("pi_", "re_", "dp_")) else part for part in path.split("/"))
