import json
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from cutylib.config import Settings, database_url_for, with_database
from cutylib.telemetry import JsonFormatter


def test_settings_read_the_environment_with_defaults(monkeypatch):
    monkeypatch.setenv("CUTY_HOLD_TTL_SECONDS", "7")
    monkeypatch.delenv("CUTY_MAX_ACTIVE_HOLDS", raising=False)
    s = Settings.from_env()
    assert s.hold_ttl_seconds == 7
    assert s.max_active_holds == 3


def test_bad_number_names_the_variable(monkeypatch):
    monkeypatch.setenv("CUTY_LEASE_SECONDS", "soon")
    with pytest.raises(ValueError, match="CUTY_LEASE_SECONDS must be a number, got 'soon'"):
        Settings.from_env()


def test_each_service_gets_its_own_database(monkeypatch):
    monkeypatch.setenv("CUTY_DATABASE_URL", "postgresql://u:p@db:5432/whatever?sslmode=require")
    monkeypatch.delenv("CUTY_CODEPOOL_DATABASE_URL", raising=False)
    assert database_url_for("codepool") == "postgresql://u:p@db:5432/cuty_codepool?sslmode=require"
    monkeypatch.setenv("CUTY_CODEPOOL_DATABASE_URL", "postgresql://x/y")
    assert database_url_for("codepool") == "postgresql://x/y"
    assert with_database("postgresql://h/a", "b") == "postgresql://h/b"


def test_json_logs_carry_trace_and_span_ids():
    tracer = TracerProvider().get_tracer("t")
    fmt = JsonFormatter("booking")
    with tracer.start_as_current_span("op") as span:
        rec = logging.LogRecord("x", logging.INFO, __file__, 1, "held %s", ("h1",), None)
        rec.hold_id = "h1"
        out = json.loads(fmt.format(rec))
    ctx = span.get_span_context()
    assert out["msg"] == "held h1"
    assert out["service"] == "booking"
    assert out["hold_id"] == "h1"
    assert out["trace_id"] == format(ctx.trace_id, "032x")
    assert out["span_id"] == format(ctx.span_id, "016x")
    assert "trace_id" not in json.loads(fmt.format(logging.LogRecord("x", 20, __file__, 1, "m", (), None)))


def test_production_refuses_development_secrets(monkeypatch):
    monkeypatch.delenv("CUTY_JWT_SECRET", raising=False)
    monkeypatch.setenv("CUTY_PSP_WEBHOOK_SECRET", "a-real-webhook-secret-of-32-bytes-or-more")
    monkeypatch.setenv("CUTY_WEBHOOK_SECRET_KEYS", "/secrets/webhook-secret-keys.json")
    monkeypatch.setenv("CUTY_ENV", "production")
    with pytest.raises(SystemExit, match="CUTY_JWT_SECRET"):
        Settings.from_env().check_secrets("gateway")
    Settings.from_env().check_secrets("payments")  # payments holds no token key: its own secret is real
    monkeypatch.setenv("CUTY_JWT_SECRET", "replace-me")
    with pytest.raises(SystemExit, match="CUTY_JWT_SECRET"):
        Settings.from_env().check_secrets("gateway")
    monkeypatch.setenv("CUTY_JWT_SECRET", "short-but-not-a-dev-value")
    with pytest.raises(SystemExit, match="at least 32 bytes"):
        Settings.from_env().check_secrets("gateway")
    monkeypatch.setenv("CUTY_JWT_SECRET", "a-real-jwt-secret-of-32-bytes-or-more")
    Settings.from_env().check_secrets("gateway")  # real: starts
    monkeypatch.setenv("CUTY_PSP_WEBHOOK_SECRET", "whsec_short")
    with pytest.raises(SystemExit, match="CUTY_PSP_WEBHOOK_SECRET"):
        Settings.from_env().check_secrets("payments")
    Settings.from_env().check_secrets("booking")  # booking holds neither secret
    monkeypatch.setenv("CUTY_ENV", "development")
    monkeypatch.delenv("CUTY_JWT_SECRET")
    Settings.from_env().check_secrets("gateway")  # development: a warning, not a refusal


def test_production_refuses_unknown_environments_missing_code_keys_and_test_hooks(monkeypatch):
    monkeypatch.setenv("CUTY_ENV", "prod")
    with pytest.raises(SystemExit, match="CUTY_ENV must be one of"):
        Settings.from_env().check_secrets("booking")
    monkeypatch.setenv("CUTY_ENV", "production")
    monkeypatch.setenv("CUTY_PSP_WEBHOOK_SECRET", "a-real-webhook-secret-of-32-bytes-or-more")
    # each service's keyring: the code pool's codes, payments' webhook endpoint secrets
    for service, keys in (("codepool", "CUTY_CODE_KEYS"), ("payments", "CUTY_WEBHOOK_SECRET_KEYS"),
                          ("payments-webhooks-out", "CUTY_WEBHOOK_SECRET_KEYS")):
        monkeypatch.delenv(keys, raising=False)
        with pytest.raises(SystemExit, match=keys):
            Settings.from_env().check_secrets(service)
        monkeypatch.setenv(keys, "/secrets/keys.json")
        Settings.from_env().check_secrets(service)
    for hook in ("CUTY_CRASH_AT", "CUTY_TEST_PAUSE_AFTER_LEASE_MS"):
        monkeypatch.setenv(hook, "1")
        with pytest.raises(SystemExit, match=hook):
            Settings.from_env().check_secrets("booking")
        monkeypatch.delenv(hook)


def test_production_refuses_jwks_without_issuer_and_audience(monkeypatch):
    # Any token signed by the identity provider's keys would do, whoever it was minted for.
    monkeypatch.setenv("CUTY_ENV", "production")
    monkeypatch.delenv("CUTY_JWT_SECRET", raising=False)
    monkeypatch.setenv("CUTY_JWT_JWKS_URL", "https://idp.example/.well-known/jwks.json")
    for issuer, audience, missing in (("", "", "CUTY_JWT_ISSUER"), ("https://idp.example/", "", "CUTY_JWT_AUDIENCE"),
                                      ("", "cuty", "CUTY_JWT_ISSUER")):
        monkeypatch.setenv("CUTY_JWT_ISSUER", issuer)
        monkeypatch.setenv("CUTY_JWT_AUDIENCE", audience)
        with pytest.raises(SystemExit, match=missing):
            Settings.from_env().check_secrets("gateway")
    monkeypatch.setenv("CUTY_JWT_ISSUER", "https://idp.example/")
    monkeypatch.setenv("CUTY_JWT_AUDIENCE", "cuty")
    Settings.from_env().check_secrets("gateway")  # both set: starts
    monkeypatch.delenv("CUTY_JWT_ISSUER")
    Settings.from_env().check_secrets("booking")  # only the gateway verifies tokens
    monkeypatch.setenv("CUTY_ENV", "development")
    Settings.from_env().check_secrets("gateway")  # development: allowed


def test_the_webhooks_out_process_needs_its_keyring_and_not_the_psp_secret(monkeypatch):
    monkeypatch.setenv("CUTY_ENV", "production")
    monkeypatch.delenv("CUTY_PSP_WEBHOOK_SECRET", raising=False)  # not given to that process at all
    monkeypatch.setenv("CUTY_WEBHOOK_SECRET_KEYS", "/secrets/keys.json")
    Settings.from_env().check_secrets("payments-webhooks-out")
    with pytest.raises(SystemExit, match="CUTY_PSP_WEBHOOK_SECRET"):
        Settings.from_env().check_secrets("payments")
