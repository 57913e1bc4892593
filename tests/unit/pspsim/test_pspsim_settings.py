import pytest

from pspsim.settings import Settings


def test_defaults():
    s = Settings.from_env({})
    assert (s.host, s.port) == ("127.0.0.1", 8090)
    assert s.webhook_url == "http://127.0.0.1:8080/v1/psp/webhooks"
    assert s.webhook_secrets == ("whsec_dev_only_cuty",)
    assert s.sync_timeout_delay_seconds == 10
    assert s.base_url == "http://127.0.0.1:8090"


def test_from_env():
    s = Settings.from_env({
        "CUTY_PSP_PORT": "9001", "CUTY_PSP_HOST": "0.0.0.0",
        "CUTY_PSP_PUBLIC_URL": "http://psp.local:9001/",
        "CUTY_PSP_WEBHOOK_URL": "http://gw/v1/psp/webhooks",
        "CUTY_PSP_WEBHOOK_SECRET": "whsec_a, whsec_b",
        "CUTY_PSP_SYNC_TIMEOUT_DELAY_SECONDS": "0.5",
        "CUTY_PSP_WEBHOOK_DELAY_MS": "5",
        "CUTY_PSP_WEBHOOK_RETRY_BASE_SECONDS": "0.01",
        "CUTY_PSP_WEBHOOK_RETRY_CAP_SECONDS": "1",
        "CUTY_PSP_WEBHOOK_MAX_ATTEMPTS": "3",
        "CUTY_PSP_SETTLE_DELAY_MS": "20",
    })
    assert s.port == 9001 and s.host == "0.0.0.0"
    assert s.base_url == "http://psp.local:9001"
    assert s.webhook_secrets == ("whsec_a", "whsec_b")
    assert s.sync_timeout_delay_seconds == 0.5
    assert (s.webhook_delay_ms, s.webhook_retry_base_seconds, s.webhook_retry_cap_seconds) == (5, 0.01, 1.0)
    assert s.webhook_max_attempts == 3 and s.settle_delay_ms == 20


def test_invalid_value_names_the_variable():
    with pytest.raises(ValueError, match="CUTY_PSP_PORT"):
        Settings.from_env({"CUTY_PSP_PORT": "http"})
