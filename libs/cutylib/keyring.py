"""AES-256-GCM keyrings: secrets at rest, each row with the id of the key it is encrypted under, so
keys can be rotated (docs/architecture.md, invariant 8). One implementation for every service: the
code pool's codes (`CUTY_CODE_KEYS`, codepool/keys.py) and payments' webhook endpoint secrets
(`CUTY_WEBHOOK_SECRET_KEYS`, payments/outbound/secrets.py). Each service holds its own keys.

A keyring is configured in one of two forms:

    k1:<base64 32 bytes>,k2:<base64 32 bytes>;active=k2[;<option>=<value>...]
    {"keys": {"k1": "<base64>", "k2": "<base64>"}, "active": "k2", ...}

or as the path of a file holding the JSON form. `active=` may be left out when there is one key.
Options are the service's own (the code pool's hash key). Unset, a development keyring is created
once under `CUTY_DATA_DIR` (never in production: Settings.check_secrets).

Ciphertexts are bound to their row: the associated data is the caller's context (the row's ids)
followed by the key id, so a ciphertext moved to another row or relabelled with another key id
fails authentication.
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import pathlib
import re
from dataclasses import dataclass
from typing import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
# Random 96-bit nonces: NIST SP 800-38D allows 2**32 encryptions under one key; rotate long before.
NONCE_BYTES = 12


class KeyringError(ValueError):
    """The keyring configuration is unusable; raised at start-up, never with key material in it."""


class IntegrityError(Exception):
    """A ciphertext does not decrypt under its key and associated data (tampered, moved, wrong key)."""


def decode_key(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(f"{what} must be base64, got something else") from None
    if len(raw) != 32:
        raise KeyringError(f"{what} must be 32 bytes (AES-256 / HMAC-SHA256), got {len(raw)}")
    return raw


def random_key_b64() -> str:
    return base64.b64encode(os.urandom(32)).decode()


@dataclass
class AeadKeyring:
    """Keys by id and the active one (new ciphertexts); any listed key decrypts."""
    keys: dict[str, bytes]
    active: str

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
        return f"{type(self).__name__}(keys={sorted(self.keys)}, active={self.active!r})"

    def seal(self, context: bytes, plaintext: bytes, nonce: bytes | None = None) -> tuple[str, bytes, bytes]:
        """(key id, nonce, ciphertext||tag) under the active key, bound to `context` and the key id."""
        nonce = nonce or os.urandom(NONCE_BYTES)
        return self.active, nonce, self._aead[self.active].encrypt(nonce, plaintext, context + self.active.encode())

    def open(self, context: bytes, key_id: str, nonce: bytes, ciphertext: bytes) -> bytes:
        """The plaintext, or IntegrityError (an unknown key id, or a ciphertext not of this context)."""
        aead = self._aead.get(key_id)
        if aead is None:
            raise IntegrityError(f"encrypted under key {key_id!r}, which is not in the keyring ({sorted(self.keys)})")
        try:
            return aead.decrypt(bytes(nonce), bytes(ciphertext), context + key_id.encode())
        except InvalidTag:
            raise IntegrityError(f"failed authentication under key {key_id!r}: the ciphertext does not belong "
                                 "here") from None


@dataclass(frozen=True)
class Spec:
    keys: dict[str, bytes]
    active: str
    options: dict[str, str]  # by their inline name


def parse_spec(spec: str, *, variable: str, options: dict[str, str] | None = None) -> Spec:
    """A keyring's configuration (either form above). `options`: the service's own settings, inline
    name -> JSON name (the code pool: {"hash": "hash_key"}). Errors name `variable`, never a key."""
    options = options or {}
    spec = spec.strip()
    found: dict[str, str] = {}
    if spec.startswith("{"):
        try:
            doc = json.loads(spec)
        except json.JSONDecodeError as e:
            raise KeyringError(f"{variable} JSON is malformed at position {e.pos}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict):
            raise KeyringError(f'{variable} JSON must be {{"keys": {{id: base64}}, "active": id, ...}}')
        keys = {str(k): decode_key(str(v), f"key {k!r}") for k, v in doc["keys"].items()}
        active = str(doc.get("active") or "")
        found = {inline: str(doc[js]) for inline, js in options.items() if doc.get(js)}
    else:
        parts = [p.strip() for p in spec.split(";") if p.strip()]
        if not parts:
            raise KeyringError(f"{variable} is empty")
        keys, active = {}, ""
        for entry in parts[0].split(","):
            kid, sep, b64 = entry.strip().partition(":")
            if not sep:
                raise KeyringError(f"{variable} entries must look like id:<base64 key>, got {kid[:32]!r}...")
            if kid in keys:
                raise KeyringError(f"key id {kid!r} is listed twice")
            keys[kid] = decode_key(b64, f"key {kid!r}")
        for opt in parts[1:]:
            name, sep, value = opt.partition("=")
            if name == "active" and sep:
                active = value.strip()
            elif name in options and sep:
                found[name] = value.strip()
            else:
                allowed = " or ".join(["active=<id>", *(f"{o}=<value>" for o in options)])
                raise KeyringError(f"{variable} option must be {allowed}, got {name!r}")
    if not active:
        if len(keys) != 1:
            raise KeyringError(f"{variable} lists {len(keys)} keys; name the active one with ;active=<id>")
        active = next(iter(keys))
    return Spec(keys, active, found)


def spec_text(value: str, data_dir: str, dev_file: str, generate: Callable[[], dict], *, variable: str) -> str:
    """The configuration text of `value` (inline, JSON or a file path), else of the development key
    file `dev_file` under `data_dir`, created with `generate()` the first time."""
    spec = value.strip()
    if not spec:
        return ensure_dev_key_file(pathlib.Path(data_dir) / dev_file, generate).read_text()
    if spec.startswith("{") or ":" in spec.split(";")[0] and not os.path.isfile(spec):
        return spec
    path = pathlib.Path(spec)
    if not path.is_file():
        raise KeyringError(f"{variable} names the file {spec!r}, which does not exist")
    return path.read_text()


def ensure_dev_key_file(path: pathlib.Path, generate: Callable[[], dict]) -> pathlib.Path:
    """Create a development keyring once (0600). Replicas racing to create it agree on one file:
    each writes a private temp file and links it into place; `link` fails if another won."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(generate(), f, indent=2)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path
