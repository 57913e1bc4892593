"""Configuration from environment variables (``CUTY_PSP_*``), with working local defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8090
    # Base of the 3DS redirect URLs; defaults to http://{host}:{port}.
    public_url: str | None = None
    webhook_url: str = "http://127.0.0.1:8080/v1/psp/webhooks"
    # The first secret signs; every secret adds a v1 value (secret rotation).
    webhook_secrets: tuple[str, ...] = ("whsec_dev_only_cuty",)
    webhook_delay_ms: int = 50
    webhook_retry_base_seconds: float = 0.2
    webhook_retry_cap_seconds: float = 10.0
    webhook_max_attempts: int = 12
    webhook_timeout_seconds: float = 5.0
    webhook_duplicate_copies: int = 3
    sync_timeout_delay_seconds: float = 10.0
    # pm_card_no_webhook: processing -> succeeded after this long.
    settle_delay_ms: int = 200
    shutdown_grace_seconds: float = 3.0
    log_level: str = "INFO"
    # Disputes (pspsim/disputes.py): pm_card_disputed is disputed this long after its capture; the
    # evidence is due this many seconds after opening; the bank decides this long after evidence.
    dispute_delay_ms: int = 200
    dispute_due_seconds: float = 7 * 86400
    dispute_decide_ms: int = 300

    @property
    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        d = cls()

        def get(name: str, default, conv=str):
            raw = env.get(f"CUTY_PSP_{name}")
            if raw is None or raw.strip() == "":
                return default
            try:
                return conv(raw.strip())
            except ValueError as exc:
                raise ValueError(f"CUTY_PSP_{name}: invalid value {raw!r}") from exc

        secrets_raw = get("WEBHOOK_SECRET", None)
        secrets = (
            tuple(s.strip() for s in secrets_raw.split(",") if s.strip())
            if secrets_raw
            else d.webhook_secrets
        )
        if not secrets:
            raise ValueError("CUTY_PSP_WEBHOOK_SECRET: no secret given")
        return cls(
            host=get("HOST", d.host),
            port=get("PORT", d.port, int),
            public_url=get("PUBLIC_URL", d.public_url),
            webhook_url=get("WEBHOOK_URL", d.webhook_url),
            webhook_secrets=secrets,
            webhook_delay_ms=get("WEBHOOK_DELAY_MS", d.webhook_delay_ms, int),
            webhook_retry_base_seconds=get("WEBHOOK_RETRY_BASE_SECONDS", d.webhook_retry_base_seconds, float),
            webhook_retry_cap_seconds=get("WEBHOOK_RETRY_CAP_SECONDS", d.webhook_retry_cap_seconds, float),
            webhook_max_attempts=get("WEBHOOK_MAX_ATTEMPTS", d.webhook_max_attempts, int),
            webhook_timeout_seconds=get("WEBHOOK_TIMEOUT_SECONDS", d.webhook_timeout_seconds, float),
            webhook_duplicate_copies=get("WEBHOOK_DUPLICATE_COPIES", d.webhook_duplicate_copies, int),
            sync_timeout_delay_seconds=get("SYNC_TIMEOUT_DELAY_SECONDS", d.sync_timeout_delay_seconds, float),
            settle_delay_ms=get("SETTLE_DELAY_MS", d.settle_delay_ms, int),
            shutdown_grace_seconds=get("SHUTDOWN_GRACE_SECONDS", d.shutdown_grace_seconds, float),
            log_level=get("LOG_LEVEL", d.log_level).upper(),
            dispute_delay_ms=get("DISPUTE_DELAY_MS", d.dispute_delay_ms, int),
            dispute_due_seconds=get("DISPUTE_DUE_SECONDS", d.dispute_due_seconds, float),
            dispute_decide_ms=get("DISPUTE_DECIDE_MS", d.dispute_decide_ms, int),
        )
