"""The OpenAPI document covers every route the gateway serves, with the policy it enforces."""
from gateway.openapi import document
from gateway.policy import access_for


def test_every_route_is_documented(routes):
    rs = list(routes.values())
    doc = document(rs, {r.rpc: access_for(r.rpc) for r in rs})
    assert doc["openapi"].startswith("3.")
    for r in rs:
        op = doc["paths"][r.template.openapi_path][r.http_method.lower()]
        assert op["operationId"] == r.rpc.rsplit(".", 1)[-1]
        assert (op["security"] == []) == access_for(r.rpc).public
        if r.server_streaming:  # Server-Sent Events, each event's resource documented beside
            ref = op["responses"]["200"]["content"]["text/event-stream"]["x-cuty-event-schema"]["$ref"]
        else:
            ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[-1] in doc["components"]["schemas"]
    create = doc["paths"]["/v1/checkouts"]["post"]
    assert any(p["name"] == "Idempotency-Key" and p["required"] for p in create["parameters"])
    slots = doc["paths"]["/v1/salons/{salon_id}/slots"]["get"]
    assert {p["name"] for p in slots["parameters"]} == {"salon_id", "startTime", "endTime", "availableOnly",
                                                         "pageSize", "pageToken", "Request-Timeout"}
    lists = doc["paths"]["/v1/checkouts"]["get"]
    assert {p["name"] for p in lists["parameters"]} == {"salonId", "productId", "state", "createdAfter",
                                                         "createdBefore", "pageSize", "pageToken", "Request-Timeout"}
    agenda = doc["paths"]["/v1/salons/{salon_id}/bookings"]["get"]
    assert {p["name"] for p in agenda["parameters"]} == {"salon_id", "day", "includeHeld", "pageSize", "pageToken",
                                                          "Request-Timeout"}
    money = doc["components"]["schemas"]["cuty.common.v1.Money"]["properties"]
    assert money["amountMinor"] == {"type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$", "default": "0"}
    # the path variable is not repeated in the request body schema
    pay = doc["paths"]["/v1/checkouts/{checkout_id}:pay"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(pay["properties"]) == {"paymentMethod", "acceptNoShowFee"}



def test_each_route_documents_the_problems_it_can_answer(routes):
    """Problem responses per status, not only a `default`."""
    rs = list(routes.values())
    doc = document(rs, {r.rpc: access_for(r.rpc) for r in rs})
    problem = {"$ref": "#/components/schemas/Problem"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path in ("/healthz", "/readyz", "/openapi.json"):
                continue
            answers = op["responses"]
            assert answers["default"]["content"]["application/problem+json"]["schema"] == problem
            for status, answer in answers.items():
                if status not in ("200", "default"):
                    assert answer["content"]["application/problem+json"]["schema"] == problem, (path, status)
                    assert answer["description"]
            assert {"400", "503"} <= set(answers), (path, method)
            assert ("401" in answers and "403" in answers) == bool(op["security"]), (path, method)
    pay = doc["paths"]["/v1/checkouts/{checkout_id}:pay"]["post"]["responses"]
    assert {"401", "403", "404", "409", "422", "429"} <= set(pay)
    webhook = doc["paths"]["/v1/psp/webhooks"]["post"]["responses"]
    assert "401" in webhook and "403" not in webhook and "422" not in webhook
    slots = doc["paths"]["/v1/salons/{salon_id}/slots"]["get"]["responses"]
    assert "409" not in slots and "422" not in slots


def test_every_operation_takes_request_timeout_and_names_its_criticality(routes):
    rs = list(routes.values())
    doc = document(rs, {r.rpc: access_for(r.rpc) for r in rs})
    for r in rs:
        op = doc["paths"][r.template.openapi_path][r.http_method.lower()]
        header = [p for p in op["parameters"] if p["name"] == "Request-Timeout"]
        assert len(header) == 1 and header[0]["in"] == "header" and not header[0]["required"], r.rpc
        assert op["x-cuty-criticality"] in ("critical", "normal", "sheddable")
        assert {"429", "503"} <= set(op["responses"]), r.rpc  # public routes are limited per address too
    pay = doc["paths"]["/v1/checkouts/{checkout_id}:pay"]["post"]
    assert pay["x-cuty-criticality"] == "critical" and "overloaded" in pay["responses"]["503"]["description"]



def test_every_reference_in_the_document_resolves(routes):
    """A client (or Schemathesis) reading the document finds every schema it names."""
    import json
    import re
    rs = list(routes.values())
    doc = document(rs, {r.rpc: access_for(r.rpc) for r in rs})
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(doc)))
    assert refs and not refs - set(doc["components"]["schemas"]), refs - set(doc["components"]["schemas"])
