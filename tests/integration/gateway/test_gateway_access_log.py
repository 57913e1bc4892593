"""Every request leaves one access-log line (method, route template, status, duration, trace id,
subject; never a token or a body) and one observation of http_server_request_duration_seconds."""
import json
import logging

from prometheus_client import REGISTRY


def route_count(route: str, status: str) -> float:
    return REGISTRY.get_sample_value("http_server_request_duration_seconds_count", {
        "http_request_method": "POST", "http_route": route, "http_response_status_code": status}) or 0.0


async def test_access_line_names_the_route_template_and_subject_never_the_token(client, fake, bearer, caplog):
    route = "/v1/checkouts/{checkout_id}:pay"
    before = route_count(route, "200")
    headers = {**bearer("customer", sub="cust-42"), "Idempotency-Key": "k-access-1"}
    secret_body = json.dumps({"paymentMethod": "pm_card_ok-secret-body-marker"})
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        r = await client.post("/v1/checkouts/00000000-0000-4000-8000-000000000012:pay", headers=headers, content=secret_body)
    assert r.status_code == 200
    (line,) = [rec for rec in caplog.records if rec.name == "gateway.access"]
    assert (line.method, line.route, line.status, line.subject) == ("POST", route, 200, "cust-42")
    assert line.trace_id == r.headers["x-trace-id"] and line.duration_ms > 0
    token = headers["Authorization"].split()[1]
    logged = json.dumps({k: str(v) for k, v in vars(line).items()})
    assert token not in logged and "secret-body-marker" not in logged and "00000000-0000-4000-8000-000000000012" not in logged
    assert route_count(route, "200") == before + 1


async def test_refused_requests_are_logged_without_a_subject(client, caplog):
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        r = await client.post("/v1/checkouts", headers={"Authorization": "Bearer not-a-jwt"}, content="{}")
    assert r.status_code == 401
    (line,) = [rec for rec in caplog.records if rec.name == "gateway.access"]
    assert (line.route, line.status, line.subject) == ("/v1/checkouts", 401, "")
    assert "not-a-jwt" not in json.dumps({k: str(v) for k, v in vars(line).items()})
