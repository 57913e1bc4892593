"""The operator's view: `python -m payments ops <command>`, run in a payments pod.

    python -m payments ops story <checkout id | payment id | PSP intent id | idempotency key> [--json]
    python -m payments ops stuck [--older-than SECONDS] [--json]
    python -m payments ops retry <checkout id> --by <who>
    python -m payments ops refund <payment id> --by <who> [--reason TEXT] [--force]
    python -m payments ops audit --since <instant> [--until <instant>] [--settle SECONDS] [--recorded] [--json]

`story` and `stuck` only read: SQL on the payments database (CUTY_PAYMENTS_DATABASE_URL, or
CUTY_DATABASE_URL's cuty_payments), so they work while gRPC is down. `retry` and `refund` change
things, so they go through the payments gRPC API (CUTY_PAYMENTS_ADDR) as the payments service's own
identity (its certificate, in its pod: the principal `system`): the same code path, checks and
idempotency keys as everything else, never a hand-written UPDATE. `--by` travels as metadata
`cuty-operator`, which the service honours only from `system` (payments/operator.py), and lands in
the timeline: "retried by ops:<who>", "refund requested by ops:<who>: <reason>".

`audit` runs the invariant auditor's checks (payments/audit.py) over the windows of [since, until)
at once, as the payments identity (booking's and the code pool's digests over gRPC, the PSP's list
API), and prints every violation, one line each: its kind and the offending ids (exit 3 when there
are any). It records nothing and leaves the watermark alone: the periodic job records, counts and
alerts. `--recorded` prints what the periodic job recorded for the windows ending after `since`.

CUTY_TRACE_URL_TEMPLATE (e.g. `http://jaeger:16686/trace/{trace_id}`) turns trace ids into links.
docs/observability.md has the runbook ("On call: customer charged but no booking").

The package: `cli` (the command line), `queries` (the reads: SQL on the payments database, and
`story` / `stuck` gathering them), `diagnosis` (where a checkout stands and what to do, from those
facts alone), `render` (text for a terminal), `actions` (the changes, through the gRPC API).
"""
from __future__ import annotations

from .actions import REFUND_WITHOUT_FORCE, refund, refund_key, retry
from .cli import main
from .diagnosis import STEP_OF_STATE, diagnose
from .queries import TRACE_URL_TEMPLATE, Story, find, story, stuck, trace_link
from .render import render, render_stuck

__all__ = ["REFUND_WITHOUT_FORCE", "STEP_OF_STATE", "Story", "TRACE_URL_TEMPLATE", "diagnose", "find", "main",
           "refund", "refund_key", "render", "render_stuck", "retry", "story", "stuck", "trace_link"]
