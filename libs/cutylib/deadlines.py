"""The deadline of the RPC being served, for the work done on its behalf (docs/conventions.md,
"Deadlines").

The server interceptor (grpc_server.TrustAndErrorInterceptor) records the call's deadline in a
contextvar; what waits or calls on in the request's name reads it here:
- the pool waits for a connection at most until the deadline (db.BoundedPool), and a unit of work
  bounds its statements by it (db.UnitOfWork: SET LOCAL statement_timeout);
- onward gRPC calls get min(their default, the time left) (grpc_client);
- the checkout saga does not start a step that calls another service when the time is spent,
  until its charge has started (payments.checkout.engine).

Work without a caller (background workers, start-up) has no deadline: None everywhere here. Tasks
created while serving a call inherit its deadline (contextvars are copied); `detached()` lifts it
for work that must finish whatever the caller does.

Times are on `time.monotonic()`; the deadline is stored as an absolute instant so that reading the
time left costs a clock read, not a call into grpc.
"""
from __future__ import annotations

import contextlib
import contextvars
import time

from .errors import DeadlineExceeded

# What is kept back from a caller's deadline for the answer to reach it: work that could only end
# after this point is not started (or is cut off) and the call answers DEADLINE_EXCEEDED instead.
MARGIN_SECONDS = 0.05

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("cuty_deadline", default=None)


def current() -> float | None:
    """The current call's deadline (a `time.monotonic()` instant), or None."""
    return _deadline.get()


def remaining() -> float | None:
    """Seconds left until the current call's deadline (negative once passed), or None."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def left(deadline: float) -> float:
    """Seconds left until `deadline` (an instant from `current()`)."""
    return deadline - time.monotonic()


def spent(seconds_left: float | None) -> bool:
    """Whether `seconds_left` (None: no deadline) leaves no time for work and the answer."""
    return seconds_left is not None and seconds_left <= MARGIN_SECONDS


def budget(what: str) -> float | None:
    """Seconds that `what` may take within the current call's deadline (the margin kept back), or
    None without a deadline; DeadlineExceeded when nothing is left."""
    seconds = remaining()
    if seconds is None:
        return None
    if seconds <= MARGIN_SECONDS:
        raise exceeded(what)
    return seconds - MARGIN_SECONDS


def exceeded(what: str) -> DeadlineExceeded:
    return DeadlineExceeded(f"the request's deadline leaves no time to {what}", reason="deadline-exceeded")


def start(seconds_left: float | None) -> contextvars.Token | None:
    """Record the deadline of a call with `seconds_left` (grpc's `context.time_remaining()`);
    None (no deadline) records nothing. Returns the token for `end`."""
    if seconds_left is None:
        return None
    return _deadline.set(time.monotonic() + seconds_left)


def end(token: contextvars.Token | None) -> None:
    if token is not None:
        _deadline.reset(token)


@contextlib.contextmanager
def within(deadline: float | None):
    """`deadline` (an instant from `current()`, or None) is the current one inside the block."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def detached():
    """No deadline inside the block: work that finishes whatever its caller does (the saga once
    money moves, handing a lease back), with the defaults of workers."""
    return within(None)
