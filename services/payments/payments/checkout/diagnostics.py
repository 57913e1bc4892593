"""The staff view's diagnostics of a checkout (docs/observability.md, "The operator's view"): how its current step is
doing (attempts, last error, since when), the state a NEEDS_ATTENTION saga left, its trace id.

Shown only to staff, admins and internal callers (GetCheckout), never to the customer: an error
text names internals, not something a buyer can act on. Read with one statement beside the view."""
from __future__ import annotations

from .answers import Diagnostics

READ = """
SELECT attempts, last_error, failing_since, attention_from, traceparent, updated_at, version
FROM checkouts WHERE id = $1
"""


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a W3C traceparent (`00-<trace id>-<span id>-<flags>`), '' when there is none."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32 else ""


def from_row(row) -> Diagnostics:
    return Diagnostics(attempts=row["attempts"], last_error=row["last_error"], failing_since=row["failing_since"],
                       attention_from=row["attention_from"] or "", trace_id=trace_id_of(row["traceparent"]),
                       updated_at=row["updated_at"], version=row["version"])


async def read(conn, checkout_id: str) -> Diagnostics | None:
    row = await conn.fetchrow(READ, checkout_id)
    return None if row is None else from_row(row)
