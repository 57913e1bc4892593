"""The operator's view of the code pool: `python -m codepool ops code`, run in a code pool pod.

    python -m codepool ops code <code value | code id | order id> --by <you> [--json]

Finds a code however support has it (a value a customer reads out, a code id from a log, the
order id, which is the checkout id of `python -m payments ops story`) and prints its product, batch,
states with their times, every order it went to (and how that ended), every read of it and the
audit trail (codepool/incident.py). Only reads, on the code pool database (CUTY_CODEPOOL_DATABASE_URL,
or CUTY_DATABASE_URL's cuty_codepool) with the code pool's keyring (CUTY_CODE_KEYS: the hash key
finds a value, values are shown masked); the lookup itself is audited (`operator_read` by
`ops:<you>`). docs/codepool.md, "Incident story"; the runbook: docs/observability.md, "On call:
the code never arrived, or was sold twice".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

import asyncpg

from .incident import Story, look_up
from .keys import KeyringError


def _times(row: dict) -> str:
    """When an order (or one code's part of it) was reserved, delivered, released, and its payment."""
    return (f"reserved {row['reserved_at']}  delivered {row['delivered_at'] or '-'}  released {row['released_at'] or '-'}"
            + (f" ({row['release_reason']})" if row["release_reason"] else "")
            + f"  payment {row['payment_transaction_id'] or '-'}")


def render(s: Story) -> str:
    """The story as text, for someone who did not write the code."""
    shown = s.query if s.matched != "code value" else "(the code value given)"
    if not s.matched:
        return (f"nothing found for {shown} (tried: code id, order id, code value by its keyed hash; "
                "a value must be typed exactly as imported)")
    lines = [f"== {shown}: matched {s.matched}, {len(s.codes)} code(s)"
             + (" (more not shown)" if s.more_codes else "")]
    add = lines.append
    if len(s.codes) > 1 and s.matched == "code value":
        add("   THE SAME VALUE IS STORED AS SEVERAL CODES (imported under several products or merchants):"
            " each may be sold once, so the value can reach two buyers. See the batches below.")
    o = s.order
    if o is not None:
        add(f"order {o['order_id']} (checkout id; `python -m payments ops story {o['order_id']}`)  merchant "
            f"{o['merchant_id']}  customer {o['customer_id']}")
        add(f"  {o['status']}  x{o['quantity']} of product {o['product_id']}  expires {o['expires_at']}  {_times(o)}")
        if not s.codes:
            add("  no code was ever reserved for this order")
    for c in s.codes:
        code = c.code
        add("")
        add(f"code {code['id']}  {code['masked_value']}  now {code['status']}  merchant {code['merchant_id']}")
        add(f"  product {code['product_id']} ({code['sku']}, {code['product_name']})")
        add(f"  batch {code['batch_id']} ({code['batch_ref']}) imported {code['batch_imported_at']} "
            f"by {code['batch_imported_by']}  key {code['key_id']}")
        add(f"  states: available {code['created_at']}  reserved {code['reserved_at'] or '-'}  "
            f"delivered {code['delivered_at'] or '-'}")
        add(f"  orders it went to ({len(c.deliveries)}):")
        for d in c.deliveries:
            add(f"    {d['order_id']}  customer {d['customer_id']}  {d['status']} (order {d['order_status']})  {_times(d)}")
        if not c.deliveries:
            add("    (none)")
        add(f"  reads ({len(c.reads)}; admin reveals counted: {code['views'] or 0}):")
        for e in c.reads:
            add(f"    {e['at']}  {e['action']:<14} by {e['actor']}  {json.dumps(e['details'])}")
        if not c.reads:
            add("    (never read in clear)")
        add("  audit trail:")
        for e in c.trail:
            add(f"    {e['at']}  {e['action']:<16} by {e['actor']:<24} order {e['order_id'] or '-'}"
                + (f"  {json.dumps(e['details'])}" if e["details"] else ""))
    add("")
    add("this lookup is recorded in the audit log (operator_read)")
    return "\n".join(lines)


async def _run(args) -> int:
    from cutylib.config import Settings, database_url_for

    from .bootstrap import check_hash_key, create_codepool_pool, load_keyring

    settings = Settings.from_env()
    keyring = load_keyring(settings)
    pool = await create_codepool_pool(database_url_for("codepool"), settings, min_size=1, max_size=2,
                                      application_name="cuty-codepool-ops")
    try:
        await check_hash_key(pool, keyring)  # another hash key would find no value, silently
        story = await look_up(pool, keyring, args.id, by=args.by)
    finally:
        await pool.close()
    print(json.dumps(story.to_json(), indent=2) if args.json else render(story))
    return 0 if story.matched else 1


def main(argv: list[str]) -> int:
    from cutylib.errors import DomainError

    parser = argparse.ArgumentParser(prog="python -m codepool ops", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    code = sub.add_parser("code", help="everything about a code: product, batch, states, orders, reads, audit trail")
    code.add_argument("id", help="the code's value (as the customer reads it), its id, or the order id")
    code.add_argument("--by", required=True, help="who is looking (recorded in the audit log)")
    code.add_argument("--json", action="store_true", help="machine-readable")
    args = parser.parse_args(argv)
    args.by = args.by.strip()
    if not 1 <= len(args.by) <= 100:
        parser.error("--by must name who is looking (1-100 characters)")
    try:
        return asyncio.run(_run(args))
    except DomainError as e:
        print(f"{e.code.name}: {e.message}", file=sys.stderr)
        return 2
    except KeyringError as e:
        print(f"cannot use the code keys (CUTY_CODE_KEYS): {e}", file=sys.stderr)
        return 2
    except (OSError, asyncpg.PostgresError) as e:
        print(f"cannot reach the code pool database: {e}", file=sys.stderr)
        return 1
