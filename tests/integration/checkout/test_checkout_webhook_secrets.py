"""Webhook endpoint secrets encrypted at rest (payments/outbound/secrets.py, cutylib.keyring; the
table webhook_endpoints). A new endpoint's secret is stored only as ciphertext bound to its row; the
delivery still signs with it; the database refuses a plaintext secret, inserted or updated; a
ciphertext moved to another endpoint does not open and nothing is POSTed with it; rotation keeps
old rows readable."""
from __future__ import annotations

import base64
import os
import uuid

import asyncpg
import pytest

from cutylib.keyring import AeadKeyring
from cutylib.principal import Principal
from cutylib.testing.trust import TEST_MERCHANT
from payments import signature
from payments.outbound.repository import Deliveries, Endpoints
from payments.outbound.secrets import SecretBox, SecretDamaged
from payments.outbound.service import WebhookEndpoints

from test_checkout_outbound_events import buy_codes

ADMIN = Principal("admin-1", "admin", TEST_MERCHANT)


def box(*key_ids: str, active: str | None = None, keys: dict[str, bytes] | None = None) -> SecretBox:
    keys = keys or {k: os.urandom(32) for k in key_ids}
    return SecretBox(AeadKeyring(keys, active or list(keys)[-1]))


@pytest.fixture(autouse=True)
async def clean(checkout_pool):
    await checkout_pool.execute("DELETE FROM webhook_endpoints")
    yield
    await checkout_pool.execute("DELETE FROM webhook_endpoints")


async def test_a_new_secret_is_stored_only_encrypted_and_still_signs(harness):
    h = harness
    sb = box("k1")
    endpoints = WebhookEndpoints(Endpoints(h.pool, sb), "development")
    ep = await endpoints.create(ADMIN, "https://hooks.example.com/cuty", ["checkout.completed"])
    assert ep.secret.startswith("whsec_")
    row = await h.pool.fetchrow("SELECT *, t::text AS whole FROM webhook_endpoints t WHERE id = $1", uuid.UUID(ep.id))
    assert row["secret"] is None and row["secret_key_id"] == "k1" and len(row["secret_nonce"]) == 12
    assert ep.secret not in row["whole"] and ep.secret.encode() not in bytes(row["secret_ciphertext"])
    hexed = ep.secret.removeprefix("whsec_")
    assert hexed not in row["whole"] and bytes.fromhex(hexed) not in bytes(row["secret_ciphertext"])
    # the worker's claim opens it and signs with it
    await buy_codes(h)
    [claimed] = await Deliveries(h.pool, sb).claim_due("secret-test", 10, 30)
    assert claimed.secret == ep.secret
    signature.verify(signature.sign(claimed.secret, claimed.payload), claimed.payload, [ep.secret])
    # plaintext is refused by the database, whoever writes it
    with pytest.raises(asyncpg.CheckViolationError):
        await h.pool.execute("UPDATE webhook_endpoints SET secret = $2, secret_key_id = NULL, secret_nonce = NULL, "
                             "secret_ciphertext = NULL WHERE id = $1", uuid.UUID(ep.id), ep.secret)


async def test_a_ciphertext_moved_to_another_endpoint_does_not_open_and_nothing_is_sent(harness):
    h = harness
    sb = box("k1")
    endpoints = WebhookEndpoints(Endpoints(h.pool, sb), "development")
    a = await endpoints.create(ADMIN, "https://hooks.example.com/a", ["checkout.completed"])
    b = await endpoints.create(ADMIN, "https://hooks.example.com/b", ["checkout.completed"])
    await h.pool.execute("UPDATE webhook_endpoints b SET secret_nonce = a.secret_nonce, "
                         "secret_ciphertext = a.secret_ciphertext FROM webhook_endpoints a "
                         "WHERE a.id = $1 AND b.id = $2", uuid.UUID(a.id), uuid.UUID(b.id))
    row = await h.pool.fetchrow("SELECT merchant_id, id AS endpoint_id, secret, secret_key_id, secret_nonce, "
                                "secret_ciphertext FROM webhook_endpoints WHERE id = $1", uuid.UUID(b.id))
    with pytest.raises(SecretDamaged):
        sb.secret_of(row)
    with pytest.raises(SecretDamaged):  # nor under another keyring
        box("k1").secret_of({**dict(row), "endpoint_id": a.id, "secret": None})
    await buy_codes(h)
    claimed = {c.endpoint_id: c for c in await Deliveries(h.pool, sb).claim_due("secret-test", 10, 30)}
    assert claimed[a.id].secret == a.secret and claimed[b.id].secret is None


async def test_rotation_keeps_old_rows_readable(harness):
    h = harness
    k1, k2 = os.urandom(32), os.urandom(32)
    old = box(keys={"k1": k1})
    ep = await WebhookEndpoints(Endpoints(h.pool, old), "development").create(
        ADMIN, "https://hooks.example.com/r", ["checkout.completed"])
    rotated = box(keys={"k1": k1, "k2": k2}, active="k2")
    new = await WebhookEndpoints(Endpoints(h.pool, rotated), "development").create(
        ADMIN, "https://hooks.example.com/s", ["checkout.completed"])
    await buy_codes(h)
    claimed = {c.endpoint_id: c for c in await Deliveries(h.pool, rotated).claim_due("secret-test", 10, 30)}
    assert claimed[ep.id].secret == ep.secret and claimed[new.id].secret == new.secret
    keys = dict(await h.pool.fetch("SELECT id::text, secret_key_id FROM webhook_endpoints"))
    assert keys == {ep.id: "k1", new.id: "k2"}


async def test_the_database_refuses_a_plaintext_secret_on_insert(harness):
    with pytest.raises(asyncpg.CheckViolationError, match="stored encrypted"):
        await harness.pool.execute(
            "INSERT INTO webhook_endpoints (merchant_id, id, url, events, secret, created_by) "
            "VALUES ('m', $1, 'https://h.example.com/x', '{checkout.completed}', $2, 'a')",
            uuid.uuid4(), "whsec_" + "0" * 64)
    # nothing in plaintext, so nothing for a replica to seal at start
    assert await box("k1").encrypt_stored(harness.pool) == 0


def test_the_keyring_is_configured_like_the_code_pools(tmp_path):
    k = base64.b64encode(os.urandom(32)).decode()
    sb = SecretBox.load(f"w1:{k}", str(tmp_path))
    assert sb.ring.active == "w1" and "w1" in repr(sb.ring) and k not in repr(sb.ring)
    dev = SecretBox.load("", str(tmp_path))  # development: a key file made once under the data dir
    assert SecretBox.load("", str(tmp_path)).ring.keys == dev.ring.keys
    assert (tmp_path / "payments-webhook-keys.json").stat().st_mode & 0o077 == 0
