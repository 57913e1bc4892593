"""Webhook endpoint secrets, encrypted at rest (docs/webhooks-out.md "Secrets").

Signing a delivery needs the secret itself, so it cannot be hashed; it is stored as AES-256-GCM
ciphertext under payments' own keyring (`CUTY_WEBHOOK_SECRET_KEYS`, cutylib.keyring: the platform's
one implementation, the code pool's codes use it too), with the key id per row for rotation and the
row's merchant and endpoint id as associated data (a ciphertext copied to another endpoint does not
open). The database refuses a plaintext secret (trigger webhook_endpoints_no_plaintext); a row that
holds one in the `secret` column all the same is sealed by `encrypt_stored` (run by every replica at
start, before it serves).
"""
from __future__ import annotations

import functools
import logging
import uuid

import asyncpg

from cutylib import keyring
from cutylib.config import Settings
from cutylib.db import UnitOfWork
from cutylib.keyring import AeadKeyring, IntegrityError

log = logging.getLogger(__name__)

VARIABLE = "CUTY_WEBHOOK_SECRET_KEYS"
DEV_KEY_FILE = "payments-webhook-keys.json"

# Plaintext rows (the `secret` column), a batch that no other replica is sealing.
CLAIM_PLAINTEXT = """
SELECT merchant_id, id, secret FROM webhook_endpoints WHERE secret IS NOT NULL
ORDER BY merchant_id, id LIMIT $1 FOR UPDATE SKIP LOCKED
"""
# Conditional: only a row still in plaintext (and only with the plaintext that was sealed).
SEAL = """
UPDATE webhook_endpoints SET secret = NULL, secret_key_id = $4, secret_nonce = $5, secret_ciphertext = $6
WHERE merchant_id = $1 AND id = $2 AND secret = $3
"""


class SecretDamaged(Exception):
    """A stored secret does not open under its key and row: never used to sign."""


def _context(merchant_id: str, endpoint_id: str) -> bytes:
    return merchant_id.encode() + b"\0" + uuid.UUID(endpoint_id).bytes


class SecretBox:
    def __init__(self, ring: AeadKeyring):
        self.ring = ring

    @classmethod
    def load(cls, value: str, data_dir: str) -> "SecretBox":
        """From `CUTY_WEBHOOK_SECRET_KEYS` (inline, JSON or a file path), else a development key file
        under `CUTY_DATA_DIR` (production refuses to start without the variable)."""
        spec = keyring.parse_spec(keyring.spec_text(value, data_dir, DEV_KEY_FILE, _generate, variable=VARIABLE),
                                  variable=VARIABLE)
        return cls(AeadKeyring(spec.keys, spec.active))

    def seal(self, merchant_id: str, endpoint_id: str, secret: str) -> tuple[str, bytes, bytes]:
        return self.ring.seal(_context(merchant_id, endpoint_id), secret.encode())

    def open(self, merchant_id: str, endpoint_id: str, key_id: str, nonce: bytes, ciphertext: bytes) -> str:
        try:
            return self.ring.open(_context(merchant_id, endpoint_id), key_id, nonce, ciphertext).decode()
        except IntegrityError as e:
            raise SecretDamaged(f"the secret of endpoint {endpoint_id} {e}") from None

    def secret_of(self, row) -> str:
        """The secret of a webhook_endpoints row (joined): sealed, or plaintext not sealed yet."""
        if row["secret"] is not None:
            return row["secret"]
        return self.open(row["merchant_id"], str(row["endpoint_id"]), row["secret_key_id"], row["secret_nonce"],
                         row["secret_ciphertext"])

    async def encrypt_stored(self, pool: asyncpg.Pool, batch: int = 100) -> int:
        """Seal every endpoint secret still in plaintext; returns how many this call sealed. Safe
        with any number of replicas at once (SKIP LOCKED batches, a conditional UPDATE per row)."""
        total = 0
        while True:
            async with UnitOfWork(pool) as uow:
                rows = await uow.conn.fetch(CLAIM_PLAINTEXT, batch)
                for r in rows:
                    key_id, nonce, ct = self.seal(r["merchant_id"], str(r["id"]), r["secret"])
                    total += int((await uow.conn.execute(SEAL, r["merchant_id"], r["id"], r["secret"], key_id, nonce,
                                                         ct)).split()[-1])
                await uow.commit()
            if len(rows) < batch:
                break
        if total:
            log.info("webhook endpoint secrets encrypted", extra={"count": total, "key_id": self.ring.active})
        return total


def _generate() -> dict:
    return {"keys": {"dev1": keyring.random_key_b64()}, "active": "dev1"}


@functools.lru_cache(maxsize=1)
def default_box() -> SecretBox:
    """The process's box from its settings (one per process: the keyring is read once)."""
    settings = Settings()
    return SecretBox.load(settings.webhook_secret_keys, settings.data_dir)
