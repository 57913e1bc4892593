"""Settings of the checkout saga beyond cutylib's shared `Settings` (conventions.md)."""
from __future__ import annotations

from dataclasses import dataclass

from cutylib.config import env_field, env_float, env_int, env_str


@dataclass(frozen=True)
class CheckoutOptions:
    # Safety-net poll of the saga queue; wake-ups normally arrive by LISTEN/NOTIFY.
    poll_seconds: float = env_field(env_float, "CUTY_SAGA_POLL_SECONDS", 1.0)
    batch_size: int = env_field(env_int, "CUTY_SAGA_BATCH_SIZE", 32)
    # Sagas one replica drives at once (each mostly waits on gRPC / the PSP).
    concurrency: int = env_field(env_int, "CUTY_SAGA_CONCURRENCY", 64)
    # Retryable failures (UNAVAILABLE, DEADLINE_EXCEEDED, PSP 5xx) back off from base up to cap.
    retry_base_seconds: float = env_field(env_float, "CUTY_SAGA_RETRY_BASE_SECONDS", 0.2)
    retry_cap_seconds: float = env_field(env_float, "CUTY_SAGA_RETRY_CAP_SECONDS", 30.0)
    # How long past the hold's expiry a payment still in flight (3-D Secure, processing) is waited
    # for before its intent is cancelled. 0: cancel as soon as the hold runs out.
    expiry_grace_seconds: float = env_field(env_float, "CUTY_CHECKOUT_EXPIRY_GRACE_SECONDS", 0.0)
    # A booking's payment is given at least this long to finish (3-D Secure included): PayCheckout
    # extends the hold (booking.ExtendHold, once, by CUTY_HOLD_MAX_EXTENSION_SECONDS) only when
    # less is left of it. A buyer paying with more left costs no extension call.
    pay_window_seconds: float = env_field(env_float, "CUTY_CHECKOUT_PAY_WINDOW_SECONDS", 120.0)
    # A staff-made checkout's payment link lives this long unless the request says (1..86400):
    # its hold blocks the time meanwhile (docs/checkout.md, "Staff book for a customer").
    link_ttl_seconds: int = env_field(env_int, "CUTY_CHECKOUT_LINK_TTL_SECONDS", 86_400)
    idempotency_ttl_seconds: float = env_field(env_float, "CUTY_IDEMPOTENCY_TTL_SECONDS", 24 * 3600.0)
    # Deadline of one call to booking / the code pool; DEADLINE_EXCEEDED means "unknown" and the
    # step is retried with the same idempotency key.
    remote_deadline_seconds: float = env_field(env_float, "CUTY_SAGA_REMOTE_DEADLINE_SECONDS", 5.0)
    # A finishing step (confirm, release, refund) failing this many times in a row, or for this long,
    # stops retrying: the saga waits in NEEDS_ATTENTION for an operator.
    max_attempts: int = env_field(env_int, "CUTY_SAGA_MAX_ATTEMPTS", 30)
    attention_after_seconds: float = env_field(env_float, "CUTY_SAGA_ATTENTION_AFTER_SECONDS", 3600.0)
    # Crash injection for the crash-matrix test: "<step>:before" / "<step>:after" (comma separated).
    crash_at: str = env_field(env_str, "CUTY_CRASH_AT", "")
    # Live updates (WatchCheckout): open streams per user and per process, the warning
    # before a hold runs out (hold-expiring at TTL - this), and how often the one LISTEN connection
    # of the process is checked (a connection lost without a FIN is found within this).
    max_watch_streams_per_user: int = env_field(env_int, "CUTY_MAX_WATCH_STREAMS_PER_USER", 5)
    max_watch_streams: int = env_field(env_int, "CUTY_MAX_WATCH_STREAMS", 2000)
    hold_warning_seconds: float = env_field(env_float, "CUTY_HOLD_EXPIRING_WARNING_SECONDS", 60.0)
    watch_check_seconds: float = env_field(env_float, "CUTY_WATCH_LISTENER_CHECK_SECONDS", 10.0)
