"""After an e2e purchase, every process's /metrics (on its own port) is scraped,
and every metric named in the dashboards and alert rules is really exported."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from observability_names import metric_families
from test_one_trace_per_checkout import buy_slot


async def scrape(port: int) -> dict[str, dict]:
    """family name -> {(sample name, labels): value}."""
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(f"http://127.0.0.1:{port}/metrics")
    assert r.status_code == 200
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(r.text):
        out[fam.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}
    return out


def total(fam: dict, **labels) -> float:
    return sum(v for (_, lab), v in fam.items() if all(dict(lab).get(k) == v2 for k, v2 in labels.items()))


async def test_every_metric_of_the_dashboards_and_rules_is_exported(observed):
    _, done = await buy_slot(observed, "pm_card_ok")
    ports = observed.stack.metrics_ports
    assert set(ports) == {"booking", "codepool", "payments-0", "gateway"}
    scraped = {name: await scrape(port) for name, port in ports.items()}
    exported = {fam for fams in scraped.values() for fam in fams}
    missing = {name: sorted(files) for name, files in metric_families().items() if name not in exported}
    assert not missing, f"named in dashboards/rules but exported by no process: {missing}"

    # ...and the purchase moved them, in the process that owns each.
    booking, payments, gateway = scraped["booking"], scraped["payments-0"], scraped["gateway"]
    assert total(booking["cuty_booking_holds_taken"]) >= 1
    assert total(booking["cuty_booking_confirmations"], outcome="confirmed") >= 1
    assert total(booking["rpc_server_call_duration_seconds"], rpc_method="HoldSlot", rpc_response_status_code="OK") >= 1
    assert total(payments["cuty_checkout_sagas_finished"], state="COMPLETED") >= 1
    assert total(payments["cuty_checkout_step_duration_seconds"], step="charge") >= 1
    assert total(payments["http_client_request_duration_seconds"], url_template="/v1/payment_intents") >= 1
    assert total(payments["cuty_db_pool_max_connections"], pool="payments") > 0
    assert total(gateway["http_server_request_duration_seconds"], http_route="/v1/checkouts/{checkout_id}:pay",
                 http_response_status_code="200") >= 1
    assert done["state"].endswith("COMPLETED")
