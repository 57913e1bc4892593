"""Service identity by mutual TLS (docs/security.md).

Every gRPC hop is mutual TLS with grpc's own SSL credentials: one certificate per service whose
subject alternative name is the service's name (`booking`, `codepool`, `payments`, `gateway`), one
CA (several trusted at once while rotating). A server learns who calls from the peer certificate
(`peer_service`); a client checks the server's name whatever address it dialled
(`grpc.ssl_target_name_override`), so `127.0.0.1:50051` and a Kubernetes DNS name verify the same.

Where the files come from, for a process whose identity is `name`:

- `CUTY_TLS_CA` (one or more PEM files, comma separated; each may hold several certificates),
  `CUTY_TLS_CERT`, `CUTY_TLS_KEY`: required with `CUTY_ENV=production`;
- otherwise, in development, the development PKI under `$CUTY_DATA_DIR/tls/` (`DevPki`), created
  on first use by `make run`, the test harness or the first service that starts;
- `CUTY_TLS=off`: plaintext, only when explicitly asked for and never in production. The caller's
  identity is then the `cuty-peer` metadata it declares: development only, and said so at start.

The files are watched (`CertificateFiles`): cert-manager renews a certificate long before a pod
ends, so a process re-reads them when they change (checked at most every `CUTY_TLS_RELOAD_SECONDS`,
10) and uses the new ones without a restart. Servers hand them to grpc's dynamic server credentials
(each new connection asks for the current ones); client channels made by `grpc_client` are
recreated on the next call after a change (docs/security.md, "Rotation").
"""
from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import pathlib
import secrets
import threading
import time
from dataclasses import dataclass

import grpc

from .config import env_float, env_str

log = logging.getLogger(__name__)

PEER_KEY = "cuty-peer"  # plaintext development mode only: the identity a caller declares
DEV_DIR = "tls"
# Identities: the names in the certificates' SANs and in every service's caller table.
GATEWAY, BOOKING, CODEPOOL, PAYMENTS = "gateway", "booking", "codepool", "payments"
SERVICE_IDENTITIES = (GATEWAY, BOOKING, CODEPOOL, PAYMENTS)


@dataclass(frozen=True)
class TlsFiles:
    """PEM bytes of one identity: its key and certificate, and the CAs it trusts."""
    identity: str
    ca: bytes
    cert: bytes
    key: bytes


@dataclass(frozen=True)
class TlsPaths:
    """Where an identity's PEM files are: the trusted CA files, its certificate and its key."""
    ca: tuple[str, ...]
    cert: str
    key: str

    @classmethod
    def of(cls, ca: str, cert: str, key: str) -> "TlsPaths":
        return cls(tuple(p.strip() for p in ca.split(",") if p.strip()), cert, key)

    def all(self) -> tuple[str, ...]:
        return (*self.ca, self.cert, self.key)


def _stamp(paths: TlsPaths) -> tuple:
    """What tells a changed file: inode, modification time and size of each (symbolic links
    followed, so a Kubernetes Secret volume's swap of its `..data` link counts)."""
    out = []
    for path in paths.all():
        st = os.stat(path)
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


def load_files(identity: str, paths: TlsPaths) -> TlsFiles:
    """The identity's files as they are now; ValueError when they do not make a usable set (the key
    is not the certificate's, a file holds no PEM), as while a rotation has written one of them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca = b"".join(pathlib.Path(p).read_bytes().rstrip(b"\n") + b"\n" for p in paths.ca)
    cert, key = pathlib.Path(paths.cert).read_bytes(), pathlib.Path(paths.key).read_bytes()
    if not x509.load_pem_x509_certificates(ca):
        raise ValueError("no CA certificate in " + ", ".join(paths.ca))
    leaf = x509.load_pem_x509_certificates(cert)[0]
    private = serialization.load_pem_private_key(key, None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise ValueError(f"the key in {paths.key} is not the one of the certificate in {paths.cert}")
    return TlsFiles(identity, ca, cert, key)


class CertificateFiles:
    """An identity's files, re-read when they change.

    `current()` answers (generation, files) at once; at most every `check_seconds` it first looks
    at the files' inodes, times and sizes, and re-reads them when those moved. A set that does not
    fit together yet (a rotation wrote the key but not the certificate) is not taken: the current
    one stays and the files are looked at again next time. Thread-safe: grpc's core asks for the
    server's files from its own threads."""

    def __init__(self, identity: str, paths: TlsPaths, *, check_seconds: float | None = None):
        self.identity, self.paths = identity, paths
        self.check_seconds = env_float("CUTY_TLS_RELOAD_SECONDS", 10.0) if check_seconds is None else check_seconds
        self._lock = threading.Lock()
        try:
            self._stamp = _stamp(paths)
            self._state = (0, load_files(identity, paths))
        except OSError as e:
            raise SystemExit(f"cannot read {e.filename}: {e.strerror}") from None
        except ValueError as e:
            raise SystemExit(f"unusable TLS files for {identity}: {e}") from None
        self._next_check = time.monotonic() + self.check_seconds

    def current(self) -> tuple[int, TlsFiles]:
        if time.monotonic() >= self._next_check:
            self.check()
        return self._state

    def check(self) -> bool:
        """Re-read the files if they changed; True when a new set was taken."""
        with self._lock:
            self._next_check = time.monotonic() + self.check_seconds
            try:
                stamp = _stamp(self.paths)
                if stamp == self._stamp:
                    return False
                files = load_files(self.identity, self.paths)
            except (OSError, ValueError) as e:
                log.warning("TLS files changed but cannot be used (yet); keeping the current ones",
                            extra={"identity": self.identity, "error": str(e)})
                return False
            generation = self._state[0] + 1
            self._stamp, self._state = stamp, (generation, files)
        log.info("TLS certificate reloaded", extra={"identity": self.identity, "generation": generation,
                                                    "not_after": _not_after(files.cert)})
        return True


def _not_after(cert_pem: bytes) -> str:
    from cryptography import x509

    return x509.load_pem_x509_certificates(cert_pem)[0].not_valid_after_utc.isoformat()


class Transport:
    """How one process speaks gRPC: mutual TLS as `identity`, or plaintext (development only).

    `Transport(identity, files)` uses fixed PEM bytes (tests, benchmarks); `from_env` watches the
    files it was pointed at (`CertificateFiles`), so `files` and `generation` follow a rotation."""

    __slots__ = ("identity", "_files", "source")

    def __init__(self, identity: str, files: TlsFiles | None, *, source: CertificateFiles | None = None):
        self.identity = identity
        self._files = files
        self.source = source

    @property
    def secure(self) -> bool:
        return self._files is not None or self.source is not None

    @property
    def files(self) -> TlsFiles | None:
        return self.source.current()[1] if self.source is not None else self._files

    @property
    def generation(self) -> int:
        """Changes whenever the files do (always 0 for fixed files or plaintext)."""
        return self.source.current()[0] if self.source is not None else 0

    @classmethod
    def plaintext(cls, identity: str) -> "Transport":
        return cls(identity, None)

    @classmethod
    def watching(cls, identity: str, paths: TlsPaths) -> "Transport":
        return cls(identity, None, source=CertificateFiles(identity, paths))

    @classmethod
    def from_env(cls, identity: str) -> "Transport":
        environment = env_str("CUTY_ENV", "development")
        mode = env_str("CUTY_TLS", "on").lower()
        if mode not in ("on", "off"):
            raise SystemExit(f"CUTY_TLS must be 'on' or 'off', got {mode!r}")
        if mode == "off":
            if environment == "production":
                raise SystemExit("refusing to start with CUTY_ENV=production and CUTY_TLS=off: "
                                 "every gRPC hop must be mutual TLS")
            log.warning("plaintext gRPC (CUTY_TLS=off): callers are trusted to declare who they are; "
                        "development only", extra={"identity": identity})
            return cls.plaintext(identity)
        ca, cert, key = (env_str(v, "") for v in ("CUTY_TLS_CA", "CUTY_TLS_CERT", "CUTY_TLS_KEY"))
        if ca or cert or key:
            missing = [n for n, v in (("CUTY_TLS_CA", ca), ("CUTY_TLS_CERT", cert), ("CUTY_TLS_KEY", key)) if not v]
            if missing:
                raise SystemExit(f"incomplete TLS settings: {', '.join(missing)} not set")
            return cls.watching(identity, TlsPaths.of(ca, cert, key))
        if environment == "production":
            raise SystemExit("refusing to start with CUTY_ENV=production without CUTY_TLS_CA, CUTY_TLS_CERT "
                             "and CUTY_TLS_KEY (mutual TLS between services)")
        return cls.watching(identity, DevPki.default().paths(identity))

    # Server side ----------------------------------------------------------------------------------
    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        if not self.secure:
            return server.add_insecure_port(address)
        if self.source is None:
            files = self.files
            creds = grpc.ssl_server_credentials([(files.key, files.cert)], root_certificates=files.ca,
                                                require_client_auth=True)
            return server.add_secure_port(address, creds)
        source, served = self.source, [-1]

        def configuration(files: TlsFiles):
            return grpc.ssl_server_certificate_configuration([(files.key, files.cert)], root_certificates=files.ca)

        def fetch():
            # Called by grpc's core before each new connection's handshake, from its own threads:
            # the current files when they changed since last answered, else None (keep them).
            generation, files = source.current()
            if generation == served[0]:
                return None
            served[0] = generation
            return configuration(files)

        generation, files = source.current()
        served[0] = generation
        creds = grpc.dynamic_ssl_server_credentials(configuration(files), fetch, require_client_authentication=True)
        return server.add_secure_port(address, creds)

    # Client side ----------------------------------------------------------------------------------
    def channel(self, addr: str, target: str, *, options: list[tuple] | None = None,
                interceptors=None) -> grpc.aio.Channel:
        """A channel to the service named `target` at `addr`, presenting this identity.

        Calls spread over every address the name resolves to (round_robin: replicas behind a
        headless Service, `dns:///booking.cuty.svc.cluster.local:50051`, or `ipv4:a:p,b:p`), and
        keepalive pings find a dead connection before a call does (docs/deploy.md)."""
        options = [("grpc.lb_policy_name", "round_robin"), ("grpc.keepalive_time_ms", 30_000),
                   ("grpc.keepalive_timeout_ms", 10_000), *(options or [])]
        files = self.files
        if files is None:
            return grpc.aio.insecure_channel(addr, options=options, interceptors=interceptors)
        creds = grpc.ssl_channel_credentials(root_certificates=files.ca, private_key=files.key,
                                             certificate_chain=files.cert)
        options.append(("grpc.ssl_target_name_override", target))
        return grpc.aio.secure_channel(addr, creds, options=options, interceptors=interceptors)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What the client adds to every call: its declared identity, in plaintext mode only."""
        return () if self.secure else ((PEER_KEY, self.identity),)


def peer_service(context: grpc.aio.ServicerContext, metadata) -> str | None:
    """The calling service's name from its verified certificate (the one SAN that is a bare name),
    or, on a plaintext server, the identity it declares. None: unknown caller."""
    auth = context.auth_context()
    if auth.get("transport_security_type") == [b"ssl"]:
        names = {n.decode() for n in auth.get("peer_dns", ()) or auth.get("x509_subject_alternative_name", ())}
        bare = [n for n in names if n and "." not in n and n != "localhost"]
        return bare[0] if len(bare) == 1 else None
    for k, v in metadata or ():
        if k == PEER_KEY:
            return v.decode() if isinstance(v, bytes) else v
    return None


# Development PKI ----------------------------------------------------------------------------------

class DevPki:
    """A development CA and one certificate per identity, in a folder (`$CUTY_DATA_DIR/tls`).

    Created once under a file lock, so processes starting together agree on one CA. Also issues
    the odd certificates tests need (another CA, expired, not yet valid) through `issue`.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = pathlib.Path(folder)

    @classmethod
    def default(cls) -> "DevPki":
        return cls(pathlib.Path(env_str("CUTY_DATA_DIR", ".cuty")) / DEV_DIR).ensure()

    @property
    def ca_path(self) -> pathlib.Path:
        return self.folder / "ca.crt"

    def cert_path(self, identity: str) -> pathlib.Path:
        return self.folder / f"{identity}.crt"

    def key_path(self, identity: str) -> pathlib.Path:
        return self.folder / f"{identity}.key"

    def ensure(self, identities: tuple[str, ...] = SERVICE_IDENTITIES) -> "DevPki":
        if all(self.cert_path(i).exists() for i in identities) and self.ca_path.exists():
            return self
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (self.folder / "ca.key").exists():
                # A name of its own: during a rotation the old and new CA must differ by name too,
                # since a verifier looks the issuer up by its name.
                key, cert = make_ca(f"Cuty development CA {secrets.token_hex(4)}")
                _write(self.folder / "ca.key", key)
                _write(self.ca_path, cert)
            ca_key, ca_cert = (self.folder / "ca.key").read_bytes(), self.ca_path.read_bytes()
            for identity in identities:
                if not self.cert_path(identity).exists():
                    key, cert = issue(ca_key, ca_cert, identity)
                    _write(self.key_path(identity), key)
                    _write(self.cert_path(identity), cert)
            from .identity import ensure_dev_signing_key

            ensure_dev_signing_key(self.folder)
        return self

    def paths(self, identity: str) -> TlsPaths:
        self.ensure((identity,))
        return TlsPaths((str(self.ca_path),), str(self.cert_path(identity)), str(self.key_path(identity)))

    def files(self, identity: str) -> TlsFiles:
        self.ensure((identity,))
        return TlsFiles(identity, self.ca_path.read_bytes(), self.cert_path(identity).read_bytes(),
                        self.key_path(identity).read_bytes())

    def env(self, identity: str) -> dict[str, str]:
        """The trust settings of a process with this identity, and nothing of anyone else's: its
        certificate and key, the CA, and the user-assertion key (the gateway's private key for the
        gateway, its public half for a service)."""
        from .identity import PUBLIC_KEY_FILE, SIGNING_KEY_FILE

        self.ensure((identity,))
        keys = ({"CUTY_USER_ASSERTION_KEY": str(self.folder / SIGNING_KEY_FILE)} if identity == GATEWAY
                else {"CUTY_USER_ASSERTION_PUBLIC_KEYS": str(self.folder / PUBLIC_KEY_FILE)})
        return {"CUTY_TLS_CA": str(self.ca_path), "CUTY_TLS_CERT": str(self.cert_path(identity)),
                "CUTY_TLS_KEY": str(self.key_path(identity)), **keys}

    def ca_key(self) -> bytes:
        return (self.folder / "ca.key").read_bytes()


def _write(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def make_ca(name: str, *, days: int = 3650) -> tuple[bytes, bytes]:
    """(key PEM, self-signed CA certificate PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _pem_key(key), cert.public_bytes(_encoding())


def issue(ca_key_pem: bytes, ca_cert_pem: bytes, identity: str, *, days: float = 825,
          not_before: dt.datetime | None = None, extra_names: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM) for `identity`, signed by the CA; the SAN names the identity (and
    its Kubernetes DNS names, which `peer_service` ignores), usable as server and client."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5))
    names = [identity, *extra_names]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _pem_key(key), cert.public_bytes(_encoding())


def _encoding():
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.PEM


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
