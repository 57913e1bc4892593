"""Every statement that appends to the timeline (payment_events) names the event's merchant
itself, taken from the row it is about: staff read their merchant's timeline by that column
(docs/tenancy.md), and one home for the rule is the statement, not a lookup afterwards."""
from __future__ import annotations

import re

from cutylib.testing.procs import REPO

PACKAGE = REPO / "services" / "payments" / "payments"
INSERT = re.compile(r"INSERT INTO payment_events\s*\(([^)]*)\)", re.S)


def event_inserts() -> list[tuple[str, list[str]]]:
    return [(f"{p.relative_to(PACKAGE)}:{p.read_text()[:m.start()].count(chr(10)) + 1}",
             [c.strip() for c in m.group(1).split(",")])
            for p in sorted(PACKAGE.rglob("*.py")) for m in INSERT.finditer(p.read_text())]


def test_every_event_insert_names_its_merchant():
    inserts = event_inserts()
    assert len(inserts) >= 8  # the payments core's and the saga's
    assert [where for where, columns in inserts if "merchant_id" not in columns] == []
