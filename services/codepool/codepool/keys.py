"""Code encryption keys: AES-256-GCM at rest, HMAC-SHA256 for duplicates (docs/codepool.md).

`CUTY_CODE_KEYS` holds the keyring in one of two forms:

    k1:<base64 32 bytes>,k2:<base64 32 bytes>;active=k2;hash=<base64 32 bytes>
    {"keys": {"k1": "<base64>", "k2": "<base64>"}, "active": "k2", "hash_key": "<base64>"}

or the path of a file holding the JSON form. `active=` may be left out when there is one key. The
hash key may come from `CUTY_CODE_HASH_KEY` instead; it must never change (duplicates are found by
comparing hashes). Unset, a development keyring is generated once under `CUTY_DATA_DIR`.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import pathlib
import re
import uuid
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
DEV_KEY_FILE = "codepool-keys.json"
# Random 96-bit nonces: NIST SP 800-38D allows 2**32 encryptions under one key; rotate long before.
NONCE_BYTES = 12


class KeyringError(ValueError):
    """The keyring configuration is unusable; raised at start-up, never with key material in it."""


class CodeIntegrityError(Exception):
    """A stored code does not decrypt under its key and associated data (tampered, swapped, wrong key)."""


def _decode_key(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(f"{what} must be base64, got something else") from None
    if len(raw) != 32:
        raise KeyringError(f"{what} must be 32 bytes (AES-256 / HMAC-SHA256), got {len(raw)}")
    return raw


def associated_data(code_id: bytes, product_id: bytes, key_id: str) -> bytes:
    """What the ciphertext is bound to: moving it to another row, product or key id breaks the tag."""
    return code_id + product_id + key_id.encode()


@dataclass
class Keyring:
    keys: dict[str, bytes]
    active: str
    hash_key: bytes
    _aead: dict[str, AESGCM] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyringError("the keyring has no keys")
        for kid in self.keys:
            if not KEY_ID_RE.match(kid):
                raise KeyringError(f"key id must match {KEY_ID_RE.pattern}, got {kid!r}")
        if self.active not in self.keys:
            raise KeyringError(f"active key {self.active!r} is not one of {sorted(self.keys)}")
        self._aead = {kid: AESGCM(k) for kid, k in self.keys.items()}

    def __repr__(self) -> str:  # never print key material
        return f"Keyring(keys={sorted(self.keys)}, active={self.active!r})"

    # --- hashing -------------------------------------------------------------------------------
    def code_hash(self, value: str) -> bytes:
        return hmac.digest(self.hash_key, value.encode(), "sha256")

    def hash_fingerprint(self) -> bytes:
        """Identifies the hash key without revealing it (stored in the database at first start)."""
        return hmac.digest(self.hash_key, b"cuty-codepool hash key fingerprint", "sha256")

    # --- encryption ----------------------------------------------------------------------------
    def encrypt(self, code_id: bytes, product_id: bytes, value: str, nonce: bytes | None = None) -> tuple[str, bytes, bytes]:
        """(key id, nonce, ciphertext||tag) under the active key; ids are the 16 raw uuid bytes."""
        nonce = nonce or os.urandom(NONCE_BYTES)
        ct = self._aead[self.active].encrypt(nonce, value.encode(), associated_data(code_id, product_id, self.active))
        return self.active, nonce, ct

    def decrypt(self, code_id: bytes, product_id: bytes, key_id: str, nonce: bytes, ciphertext: bytes) -> str:
        aead = self._aead.get(key_id)
        if aead is None:
            raise CodeIntegrityError(f"code {uuid.UUID(bytes=code_id)} is encrypted under key {key_id!r}, "
                                     f"which is not in the keyring ({sorted(self.keys)})")
        try:
            return aead.decrypt(bytes(nonce), bytes(ciphertext), associated_data(code_id, product_id, key_id)).decode()
        except InvalidTag:
            raise CodeIntegrityError(f"code {uuid.UUID(bytes=code_id)} failed authentication under key {key_id!r}: "
                                     "the ciphertext does not belong to this row") from None

    # --- loading -------------------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str, *, hash_key_b64: str = "") -> "Keyring":
        """A keyring from the inline or JSON form of `CUTY_CODE_KEYS` (see the module docstring)."""
        spec = spec.strip()
        if spec.startswith("{"):
            try:
                doc = json.loads(spec)
            except json.JSONDecodeError as e:
                raise KeyringError(f"CUTY_CODE_KEYS JSON is malformed at position {e.pos}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict):
                raise KeyringError('CUTY_CODE_KEYS JSON must be {"keys": {id: base64}, "active": id, "hash_key": base64}')
            keys = {str(k): _decode_key(str(v), f"key {k!r}") for k, v in doc["keys"].items()}
            active = str(doc.get("active") or "")
            hash_b64 = str(doc.get("hash_key") or "")
        else:
            parts = [p.strip() for p in spec.split(";") if p.strip()]
            if not parts:
                raise KeyringError("CUTY_CODE_KEYS is empty")
            keys, active, hash_b64 = {}, "", ""
            for entry in parts[0].split(","):
                kid, sep, b64 = entry.strip().partition(":")
                if not sep:
                    raise KeyringError(f"CUTY_CODE_KEYS entries must look like id:<base64 key>, got {kid[:32]!r}...")
                if kid in keys:
                    raise KeyringError(f"key id {kid!r} is listed twice")
                keys[kid] = _decode_key(b64, f"key {kid!r}")
            for opt in parts[1:]:
                name, sep, value = opt.partition("=")
                if name == "active" and sep:
                    active = value.strip()
                elif name == "hash" and sep:
                    hash_b64 = value.strip()
                else:
                    raise KeyringError(f"CUTY_CODE_KEYS option must be active=<id> or hash=<base64>, got {name!r}")
        if not active:
            if len(keys) != 1:
                raise KeyringError(f"CUTY_CODE_KEYS lists {len(keys)} keys; name the active one with ;active=<id>")
            active = next(iter(keys))
        hash_b64 = hash_b64 or hash_key_b64
        if not hash_b64:
            raise KeyringError("no hash key: add ;hash=<base64 32 bytes> (or \"hash_key\") to CUTY_CODE_KEYS, "
                               "or set CUTY_CODE_HASH_KEY")
        hash_key = _decode_key(hash_b64, "the hash key")
        if any(hmac.compare_digest(hash_key, k) for k in keys.values()):
            raise KeyringError("the hash key must differ from every encryption key")
        return cls(keys=keys, active=active, hash_key=hash_key)

    @classmethod
    def load(cls, code_keys: str, data_dir: str, *, hash_key_b64: str | None = None) -> "Keyring":
        """The keyring from `CUTY_CODE_KEYS` (inline, JSON or a file path), else the dev key file."""
        if hash_key_b64 is None:
            hash_key_b64 = os.environ.get("CUTY_CODE_HASH_KEY", "")
        spec = code_keys.strip()
        if not spec:
            return cls.parse(ensure_dev_key_file(pathlib.Path(data_dir) / DEV_KEY_FILE).read_text(), hash_key_b64=hash_key_b64)
        if spec.startswith("{") or ":" in spec.split(";")[0] and not os.path.isfile(spec):
            return cls.parse(spec, hash_key_b64=hash_key_b64)
        path = pathlib.Path(spec)
        if not path.is_file():
            raise KeyringError(f"CUTY_CODE_KEYS names the file {spec!r}, which does not exist")
        return cls.parse(path.read_text(), hash_key_b64=hash_key_b64)


def generate_spec(key_ids: tuple[str, ...] = ("dev1",), active: str | None = None) -> dict:
    """A fresh keyring document (JSON form) with random keys."""
    b64 = lambda: base64.b64encode(os.urandom(32)).decode()  # noqa: E731
    return {"keys": {kid: b64() for kid in key_ids}, "active": active or key_ids[-1], "hash_key": b64()}


def ensure_dev_key_file(path: pathlib.Path) -> pathlib.Path:
    """Create the development keyring once (0600). Replicas racing to create it agree on one file:
    each writes a private temp file and links it into place; `link` fails if another won."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(generate_spec(), f, indent=2)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path
