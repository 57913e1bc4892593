"""Configuration from the environment, with working local defaults (README.md, "Configuration")."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {raw!r}")


def env_str(name: str, default: str) -> str:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else raw


def env_field(read, name: str, default):
    """A dataclass field read from the environment when the object is built:
    `ttl: int = env_field(env_int, "CUTY_HOLD_TTL_SECONDS", 300)`."""
    return field(default_factory=lambda: read(name, default))


ENVIRONMENTS = ("development", "production")
MIN_SECRET_BYTES = 32
# Fault injection for the crash and lease tests: never in production.
TEST_HOOKS = ("CUTY_CRASH_AT", "CUTY_TEST_PAUSE_AFTER_LEASE_MS")
DEV_JWT_SECRET = "cuty-dev-only-jwt-secret-change-me"
DEV_WEBHOOK_SECRET = "whsec_dev_only_cuty"

# Service name -> (database name, default gRPC port)
SERVICES = {
    "booking": ("cuty_booking", 50051),
    "codepool": ("cuty_codepool", 50052),
    "payments": ("cuty_payments", 50053),
}


def database_url_for(service: str) -> str:
    """DSN of a service's own database.

    `CUTY_<SERVICE>_DATABASE_URL` wins; else `CUTY_DATABASE_URL` with the database name replaced by
    the service's (`cuty_booking`, ...); else the embedded cluster's default local address.
    """
    own = os.environ.get(f"CUTY_{service.upper()}_DATABASE_URL")
    if own:
        return own
    dbname = SERVICES[service][0]
    base = os.environ.get("CUTY_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5439/postgres"
    return with_database(base, dbname)


def migration_url_for(service: str) -> str:
    """DSN the migrations of a service run with: its database's owner (docs/security.md,
    "Database roles"). `CUTY_<SERVICE>_MIGRATION_DATABASE_URL` wins; else
    `CUTY_MIGRATION_DATABASE_URL` with the service's database name; else the service's own DSN
    (one role does both, as before the split)."""
    own = os.environ.get(f"CUTY_{service.upper()}_MIGRATION_DATABASE_URL")
    if own:
        return own
    base = os.environ.get("CUTY_MIGRATION_DATABASE_URL")
    return with_database(base, SERVICES[service][0]) if base else database_url_for(service)


def db_role_for(service: str) -> str:
    """The database role a service connects as: it owns nothing (migrations/0003_service_role.sql)."""
    return f"{service}_service"


# The role of payments' webhook delivery process (`python -m payments webhooks-out`): grants on the
# delivery tables only (payments migration 0050_webhooks_out_role.sql; docs/security.md).
WEBHOOKS_OUT_DB_ROLE = "payments_webhooks_out"
# Its plaintext gRPC health and its /metrics (CUTY_WEBHOOKS_OUT_HEALTH_PORT / _METRICS_PORT).
WEBHOOKS_OUT_HEALTH_PORT, WEBHOOKS_OUT_METRICS_PORT = 51054, 9468


def webhooks_out_database_url() -> str:
    """DSN of the webhook delivery process: `CUTY_WEBHOOKS_OUT_DATABASE_URL`, else payments' own."""
    return os.environ.get("CUTY_WEBHOOKS_OUT_DATABASE_URL") or database_url_for("payments")


def with_user(dsn: str, user: str, password: str | None = None) -> str:
    """`dsn` with its user (and password) replaced."""
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    auth = user if password is None else f"{user}:{quote(password, safe='')}"
    return urlunsplit((parts.scheme, f"{auth}@{host}", parts.path, parts.query, parts.fragment))


def with_database(dsn: str, dbname: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def health_port_for(service: str) -> int:
    """Default plaintext health port: the gRPC port + 1000 (51051, 51052, 51053)."""
    return SERVICES[service][1] + 1000


def grpc_addr_for(service: str) -> str:
    port = SERVICES[service][1]
    return env_str(f"CUTY_{service.upper()}_ADDR", f"127.0.0.1:{env_int(f'CUTY_{service.upper()}_GRPC_PORT', port)}")


@dataclass(frozen=True)
class Settings:
    http_port: int = env_field(env_int, "CUTY_HTTP_PORT", 8080)
    data_dir: str = env_field(env_str, "CUTY_DATA_DIR", ".cuty")
    jwt_secret: str = env_field(env_str, "CUTY_JWT_SECRET", DEV_JWT_SECRET)
    psp_webhook_secret: str = env_field(env_str, "CUTY_PSP_WEBHOOK_SECRET", DEV_WEBHOOK_SECRET)
    # Accepted during secret rotation, comma separated.
    psp_webhook_previous_secrets: str = env_field(env_str, "CUTY_PSP_WEBHOOK_PREVIOUS_SECRETS", "")
    psp_url: str = env_field(env_str, "CUTY_PSP_URL", "http://127.0.0.1:8090")
    hold_ttl_seconds: int = env_field(env_int, "CUTY_HOLD_TTL_SECONDS", 300)
    hold_max_extension_seconds: int = env_field(env_int, "CUTY_HOLD_MAX_EXTENSION_SECONDS", 300)
    max_active_holds: int = env_field(env_int, "CUTY_MAX_ACTIVE_HOLDS", 3)
    sweep_interval_seconds: float = env_field(env_float, "CUTY_SWEEP_INTERVAL_SECONDS", 60)
    code_reservation_ttl_seconds: int = env_field(env_int, "CUTY_CODE_RESERVATION_TTL_SECONDS", 900)
    lease_seconds: float = env_field(env_float, "CUTY_LEASE_SECONDS", 30)
    reconcile_after_seconds: float = env_field(env_float, "CUTY_RECONCILE_AFTER_SECONDS", 60)
    code_keys: str = env_field(env_str, "CUTY_CODE_KEYS", "")
    # Payments' keyring for webhook endpoint secrets at rest (cutylib.keyring's forms).
    webhook_secret_keys: str = env_field(env_str, "CUTY_WEBHOOK_SECRET_KEYS", "")
    otlp_endpoint: str = env_field(env_str, "OTEL_EXPORTER_OTLP_ENDPOINT", "")
    grpc_deadline_seconds: float = env_field(env_float, "CUTY_GRPC_DEADLINE_SECONDS", 5)
    db_pool_min: int = env_field(env_int, "CUTY_DB_POOL_MIN", 2)
    db_pool_max: int = env_field(env_int, "CUTY_DB_POOL_MAX", 20)
    # Reporting reads' own pool (lists, a salon's agenda): cutylib.db.reports.
    db_reporting_pool_max: int = env_field(env_int, "CUTY_DB_REPORTING_POOL_MAX", 3)
    environment: str = env_field(env_str, "CUTY_ENV", "development")
    # One customer may not hoard a product's stock (code pool ReserveCodes).
    max_active_reservations: int = env_field(env_int, "CUTY_MAX_ACTIVE_RESERVATIONS", 3)
    max_quantity_per_product: int = env_field(env_int, "CUTY_MAX_QUANTITY_PER_PRODUCT", 10)
    # A hold is never confirmed once its slot starts within this many seconds (0: has started).
    confirm_cutoff_seconds: float = env_field(env_float, "CUTY_CONFIRM_CUTOFF_SECONDS", 0)
    # A request waits at most this long for a pooled database connection (then UNAVAILABLE).
    db_acquire_timeout_seconds: float = env_field(env_float, "CUTY_DB_ACQUIRE_TIMEOUT_SECONDS", 5)

    @classmethod
    def from_env(cls) -> "Settings":
        return cls()

    def development_secrets(self, service: str) -> list[str]:
        """Names of the secrets `service` holds that are at a value anyone can read in this
        repository (or too short to be one). Each service holds only its own: the gateway the token
        key, payments the webhook secret, codepool the code keys (docs/security.md)."""
        weak = {"", "replace-me", DEV_JWT_SECRET, DEV_WEBHOOK_SECRET}
        held = {"gateway": [("CUTY_JWT_SECRET", self.jwt_secret)] if not os.environ.get("CUTY_JWT_JWKS_URL") else [],
                "payments": [("CUTY_PSP_WEBHOOK_SECRET", self.psp_webhook_secret)]}.get(service, [])
        return [name for name, value in held if value in weak or len(value.encode()) < MIN_SECRET_BYTES]

    def check_secrets(self, service: str) -> None:
        """Refuse to run in production on development secrets or test hooks: with them anyone could
        sign a webhook ("paid") or mint an admin token. Outside production, say so once."""
        if self.environment not in ENVIRONMENTS:
            raise SystemExit(f"CUTY_ENV must be one of {', '.join(ENVIRONMENTS)}, got {self.environment!r}")
        weak = self.development_secrets(service)
        if self.environment == "production":
            problems = [f"{', '.join(weak)} must be set to a real secret of at least {MIN_SECRET_BYTES} bytes"] if weak else []
            if service == "codepool" and not self.code_keys:
                problems.append("CUTY_CODE_KEYS must be set (one keyring shared by every replica; a development "
                                "keyring per pod could not read another pod's codes)")
            # payments-webhooks-out: the delivery workers' own process, which holds only this keyring.
            if service in ("payments", "payments-webhooks-out") and not self.webhook_secret_keys:
                problems.append("CUTY_WEBHOOK_SECRET_KEYS must be set (the webhook endpoint secrets' keyring, shared "
                                "by every replica)")
            if service == "gateway" and os.environ.get("CUTY_JWT_JWKS_URL"):
                # Without both, any token the identity provider signs (for another application, or
                # by another tenant of a shared provider) would be accepted as ours.
                unset = [name for name in ("CUTY_JWT_ISSUER", "CUTY_JWT_AUDIENCE") if not os.environ.get(name)]
                if unset:
                    problems.append(f"{' and '.join(unset)} must be set with CUTY_JWT_JWKS_URL (tokens are "
                                    "accepted only from that issuer, for this audience)")
            hooks = [name for name in TEST_HOOKS if os.environ.get(name, "") not in ("", "0")]
            if hooks:
                problems.append(f"test hooks must be unset: {', '.join(hooks)}")
            if problems:
                raise SystemExit("refusing to start with CUTY_ENV=production: " + "; ".join(problems))
            return
        if weak:
            import logging

            logging.getLogger("cutylib.config").warning(
                "development secrets in use", extra={"secrets": ",".join(weak), "environment": self.environment})
