"""The OpenAPI document says what the contracts enforce (their buf.validate rules), documents every
operation with a description and examples that keep those rules, and names its server."""
import pytest
from google.protobuf import json_format

from cutylib import validation
from gateway.openapi import document
from gateway.policy import access_for


@pytest.fixture(scope="module")
def doc(routes):
    rs = list(routes.values())
    return document(rs, {r.rpc: access_for(r.rpc) for r in rs})


def _params(op):
    return {p["name"]: p for p in op["parameters"]}


def test_every_operation_has_a_description_and_examples(doc):
    assert doc["servers"] and doc["servers"][0]["url"]
    assert "/readyz" in doc["paths"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op.get("description"), (method, path)
            ok = op["responses"]["200"]["content"]
            if "application/json" in ok:
                assert "example" in ok["application/json"], (method, path)
            if "requestBody" in op and "application/json" in op["requestBody"]["content"]:
                assert "example" in op["requestBody"]["content"]["application/json"], (method, path)


def test_every_request_example_keeps_its_contract(doc, routes):
    for r in routes.values():
        op = doc["paths"][r.template.openapi_path][r.http_method.lower()]
        if r.body != "*":
            continue
        body = dict(op["requestBody"]["content"]["application/json"]["example"])
        message = json_format.ParseDict(body, r.input_type())
        for p in op["parameters"]:
            if p["in"] == "path":
                setattr(message, p["name"], p["example"])
        assert validation.violations(message) == [], r.rpc


def test_the_rules_are_in_the_schemas(doc):
    product = doc["paths"]["/v1/products"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert product["properties"]["sku"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
    assert set(product["required"]) == {"sku", "name", "price"}
    assert product["properties"]["price"] == {"$ref": "#/components/schemas/cuty.common.v1.Money.Input"}
    money = doc["components"]["schemas"]["cuty.common.v1.Money.Input"]
    assert money["properties"]["currencyCode"]["pattern"] == "^[A-Z]{3}$" and money["required"] == ["currencyCode"]
    # Answers keep their own schema (a reschedule's difference may be negative, any currency field unset).
    assert "required" not in doc["components"]["schemas"]["cuty.common.v1.Money"]
    slots = _params(doc["paths"]["/v1/salons/{salon_id}/slots"]["get"])
    assert slots["salon_id"]["schema"]["format"] == "uuid"
    assert slots["startTime"]["required"] and slots["startTime"]["schema"]["format"] == "date-time"
    assert slots["pageSize"]["schema"]["maximum"] == 500 and slots["pageSize"]["schema"]["minimum"] == 0
    create = doc["paths"]["/v1/checkouts"]["post"]
    schema = create["requestBody"]["content"]["application/json"]["schema"]
    # exactly one given: an empty id is "not given" in proto3, so a given one is not empty
    assert schema["oneOf"] == [{"required": [n], "properties": {n: {"type": "string", "minLength": 1}}}
                               for n in ("slotId", "productId", "serviceId")]
    assert "required" not in schema
    assert schema["properties"]["quantity"]["maximum"] == 100
    key = _params(create)["Idempotency-Key"]
    assert key["required"] and key["schema"]["minLength"] == 1 and key["schema"]["maxLength"] == 255
    assert "idempotency-key-required" in create["responses"]["400"]["description"]
    lists = _params(doc["paths"]["/v1/checkouts"]["get"])
    assert lists["salonId"]["schema"]["pattern"].startswith("^$|")  # an optional filter: empty or a UUID
    hooks = doc["paths"]["/v1/webhookEndpoints"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert hooks["properties"]["events"]["minItems"] == 1 and "checkout.completed" in \
        hooks["properties"]["events"]["items"]["enum"]
