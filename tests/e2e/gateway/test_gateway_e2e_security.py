"""Auth, BOLA and bad input against the real services: refused with the right problem, nothing changes."""
import pytest


def bearer(tok: str) -> dict:
    return {"Authorization": f"Bearer {tok}"}


async def test_no_token_bad_signature_expired_are_401(http, token, salon):
    path = f"/v1/salons/{salon}/slots?startTime=2026-01-01T00:00:00Z&endTime=2026-01-02T00:00:00Z"
    for headers in ({}, bearer(token("customer", secret="a-forged-secret-0123456789abcdefghij")),
                    bearer(token("customer", ttl=-30)), bearer("not.a.token"), {"Authorization": "Basic eDp5"}):
        r = await http.get(path, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["content-type"] == "application/problem+json" and r.json()["type"] == "unauthenticated"


@pytest.mark.parametrize("method, path, role", [
    ("POST", "/v1/salons", "customer"), ("POST", "/v1/salons", "staff"),
    ("POST", "/v1/products", "staff"), ("GET", "/v1/products/00000000-0000-0000-0000-000000000000/stock", "customer"),
    ("POST", "/v1/codes/00000000-0000-0000-0000-000000000000:reveal", "staff"),
    ("POST", "/v1/checkouts", "staff"), ("POST", "/v1/checkouts", "admin"),
    ("GET", "/v1/payments/00000000-0000-0000-0000-000000000000/events", "customer"),
])
async def test_wrong_role_is_403(http, auth, method, path, role):
    r = await http.request(method, path, json={}, headers=auth(role, Idempotency_Key="k"))
    assert r.status_code == 403, r.text
    assert r.json()["type"] == "permission-denied"


async def test_another_customers_checkout_is_404_and_nothing_changes(http, auth, fresh_key, new_slots):
    slot = (await new_slots(1))[0]
    alice, mallory = auth("customer"), auth("customer")
    co = (await http.post("/v1/checkouts", json={"slotId": slot["id"]}, headers={**alice, **fresh_key()})).json()
    before = (await http.get(f"/v1/checkouts/{co['id']}", headers=alice)).content
    for method, path, body, extra in [("GET", f"/v1/checkouts/{co['id']}", None, {}),
                                      ("POST", f"/v1/checkouts/{co['id']}:pay", {"paymentMethod": "pm_card_ok"}, fresh_key()),
                                      ("POST", f"/v1/checkouts/{co['id']}:cancel", {}, {})]:
        r = await http.request(method, path, json=body, headers={**mallory, **extra})
        assert r.status_code == 404, (path, r.text)  # never 403: existence is not leaked
        assert r.json()["type"] == "not-found"
    assert (await http.get(f"/v1/checkouts/{co['id']}", headers=alice)).content == before
    unknown = await http.get("/v1/checkouts/00000000-0000-4000-8000-000000000000", headers=mallory)
    assert unknown.status_code == 404  # indistinguishable from someone else's


@pytest.mark.parametrize("body, field", [
    (b'{"slotId": ', None), (b'{"slotId": 42}', "slotId"), (b'{"quantity": "two", "productId": "x"}', "quantity"),
    (b'{"slotId": "x", "customerId": "someone-else"}', "customerId"), (b'["slotId"]', None),
])
async def test_malformed_json_wrong_types_unknown_fields(http, auth, fresh_key, body, field):
    r = await http.post("/v1/checkouts", content=body, headers={**auth("customer"), **fresh_key()})
    assert r.status_code == 400, r.text
    if field:
        assert r.json()["field"] == field


async def test_huge_body_is_413(http, auth):
    r = await http.post("/v1/salons", content=b'{"name":"' + b"A" * (1024 * 1024 + 10) + b'"}', headers=auth("admin"))
    assert r.status_code == 413


@pytest.mark.parametrize("name", ["Robert'); DROP TABLE salons;--", "<script>alert(1)</script>", "Kuaför Ayşe ✂️ %s %n {0}"])
async def test_injection_looking_strings_are_just_data(http, auth, salon, name):
    r = await http.post(f"/v1/salons/{salon}/resources", json={"name": name}, headers=auth("admin"))
    assert r.status_code == 200, r.text
    assert r.json()["name"] == name


@pytest.mark.parametrize("method, path, body, field", [
    ("GET", "/v1/checkouts/not-a-uuid", None, "checkoutId"),
    ("GET", "/v1/checkouts/1'%20OR%20'1'='1", None, "checkoutId"),
    ("POST", "/v1/checkouts", {"slotId": "../../etc/passwd"}, "slotId"),
    ("GET", "/v1/products/%3Cscript%3E/stock", None, "productId"),
])
async def test_invalid_ids_are_400_naming_the_field(http, auth, fresh_key, method, path, body, field):
    role = "staff" if "products" in path else "customer"
    r = await http.request(method, path, json=body, headers={**auth(role), **fresh_key()})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field


async def test_timestamps_without_offset_are_400_naming_the_field(http, auth, salon):
    admin = auth("admin")
    res = (await http.post(f"/v1/salons/{salon}/resources", json={"name": "tz"}, headers=admin)).json()
    r = await http.post(f"/v1/salons/{salon}/slots:batchCreate", headers=admin, json={"slots": [
        {"resourceId": res["id"], "startTime": "2031-03-08T09:00:00", "endTime": "2031-03-08T10:00:00+03:00",
         "price": {"currencyCode": "TRY", "amountMinor": "1"}}]})
    assert r.status_code == 400 and r.json()["field"] == "slots[0].startTime", r.text
    r = await http.get(f"/v1/salons/{salon}/slots", params={"startTime": "2031-03-08T09:00:00", "endTime": "2031-03-09T00:00:00Z"},
                       headers=admin)
    assert r.status_code == 400 and r.json()["field"] == "startTime", r.text


async def test_unknown_query_parameter_is_400(http, auth, salon):
    r = await http.get(f"/v1/salons/{salon}/slots", params={"startTime": "2031-03-08T00:00:00Z", "limit": "5"},
                       headers=auth("customer"))
    assert r.status_code == 400 and r.json()["field"] == "limit"
