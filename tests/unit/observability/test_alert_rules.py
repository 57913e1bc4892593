"""The alert rules load and behave as their unit tests say (`promtool test rules`), including the
incident drill: refunds failing after a late capture fire the stuck-saga and refund alerts."""
import json
import shutil
import subprocess

import pytest

from observability_names import DEPLOY, RULE_TESTS, RULES, SCRAPE_SERIES, exported_families, metric_families, recorded_names

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: install the Debian package 'prometheus' "
                             "(make test installs it when run as root)")


@needs_promtool
def test_rule_file_is_valid():
    r = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_alert_rules_unit_tests():
    r = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_prometheus_config_is_valid():
    r = subprocess.run([PROMTOOL, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboards_are_grafana_json_with_queries():
    boards = sorted((DEPLOY / "dashboards").glob("*.json"))
    assert {b.stem for b in boards} >= {"service-overview", "checkout-saga", "payments-webhooks", "inventory"}
    for b in boards:
        doc = json.loads(b.read_text())
        assert doc["uid"] and doc["title"] and doc["panels"], b.name
        assert all(t["expr"] for p in doc["panels"] for t in p["targets"]), b.name


def test_names_are_prometheus_style():
    for name, files in metric_families().items():
        assert name.islower() and not name.endswith("_total"), (name, files)
        assert not name.endswith(("_ms", "_milliseconds")), f"{name}: base units (seconds), used in {files}"


def test_every_metric_named_by_a_dashboard_or_rule_is_exported():
    """Offline: the metric-defining modules, imported, register every name the dashboards and rules
    use (the e2e suite checks the same against a running stack); every recording-rule name used is
    recorded by the rule file."""
    exported = exported_families() | SCRAPE_SERIES
    missing = {name: sorted(files) for name, files in metric_families().items() if name not in exported}
    assert not missing, f"named in dashboards/rules but defined by no module: {missing}"
    defined, used = recorded_names()
    assert used <= defined, used - defined
