"""The alert rules load and behave as their unit tests say (`promtool test rules`), including the
incident drill: refunds failing after a late capture fire the stuck-saga and refund alerts."""
import json
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from observability_names import DEPLOY, RULE_TESTS, RULES, SCRAPE_SERIES, exported_families, metric_families, recorded_names

# Each promtool run and check stands alone: parallel workers may split the file.
pytestmark = pytest.mark.spread

DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: install the Debian package 'prometheus' "
                             "(make test installs it when run as root)")


@needs_promtool
def test_rule_file_is_valid():
    r = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


RULE_TEST_FILES = sorted(RULE_TESTS.parent.glob("*.test.yml"))


def rule_test_cases():
    """Every test of every rule-test file, one pytest case each: promtool evaluates each test's
    whole series, so one file takes tens of seconds; apart, parallel workers share them."""
    for path in RULE_TEST_FILES:
        for i, _ in enumerate(yaml.safe_load(path.read_text())["tests"]):
            yield pytest.param(path, i, id=f"{path.name}-{i}")


@needs_promtool
@pytest.mark.parametrize("tests, index", rule_test_cases())
def test_alert_rules_unit_tests(tests, index, tmp_path):
    """`promtool test rules` on the file with only its test number `index` (its rule files by
    absolute path, as promtool reads them relative to the test file)."""
    doc = yaml.safe_load(tests.read_text())
    doc["tests"] = [doc["tests"][index]]
    doc["rule_files"] = [str((tests.parent / f).resolve()) for f in doc["rule_files"]]
    one = tmp_path / tests.name
    one.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run([PROMTOOL, "test", "rules", str(one)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}


def test_every_alert_has_a_test_that_fires_it():
    fired = {case["alertname"] for path in RULE_TEST_FILES for t in yaml.safe_load(path.read_text())["tests"]
             for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert set(alerts()) - fired == set()


def doc_anchors(path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings."""
    out = set()
    for line in path.read_text().splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_every_alert_has_a_description_and_a_runbook_section():
    anchors = doc_anchors(DOCS / "observability.md")
    for name, rule in alerts().items():
        ann = rule["annotations"]
        assert ann.get("description") and ann.get("summary"), name
        page, _, anchor = ann["runbook_url"].partition("#")
        assert page.endswith("/docs/observability.md") and anchor in anchors, (name, ann["runbook_url"])
        assert rule["labels"]["severity"] in ("page", "ticket"), name


def test_burn_rate_alerts_cover_the_workbook_windows():
    """Fast (page) and slow (ticket) multi-window burn-rate alerts for both SLOs, on recording rules."""
    rules = alerts()
    for slo, alert in (("checkout_errors", "CheckoutErrorBudgetBurn"), ("checkout_pay_slow", "CheckoutLatencyBudgetBurn")):
        for name, windows, severity in ((alert, ("1h", "5m", "6h", "30m"), "page"),
                                        (alert + "Slow", ("1d", "2h", "3d", "6h"), "ticket")):
            assert rules[name]["labels"]["severity"] == severity
            for w in windows:
                assert f"slo:{slo}:ratio_rate{w}" in rules[name]["expr"], (name, w)


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


def test_dashboards_choose_datasource_cluster_and_namespace_and_every_query_follows():
    """One dashboard serves every cluster and namespace (Grafana's sidecar loads them once): each
    metric selector of each query is narrowed to the chosen cluster and namespace (`.*` for All,
    which also matches the local Prometheus's series, which have neither label)."""
    from observability_names import _LABELS, _NAME

    for b in sorted((DEPLOY / "dashboards").glob("*.json")):
        doc = json.loads(b.read_text())
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert set(variables) >= {"datasource", "cluster", "namespace"}, b.name
        assert variables["namespace"]["query"]["query"] == 'label_values(up{cluster=~"$cluster"}, namespace)'
        assert all(variables[v]["allValue"] == ".*" and variables[v]["includeAll"] for v in ("cluster", "namespace"))
        for p in doc["panels"]:
            assert p["datasource"]["uid"] == "${datasource}", (b.name, p["title"])
            for t in p["targets"]:
                for m in re.finditer(_NAME.pattern + r"(\{[^}]*\})?", t["expr"]):
                    if m.group(1) in _LABELS:
                        continue
                    assert m.group(2) and m.group(2).startswith('{cluster=~"$cluster",namespace=~"$namespace"'), \
                        (b.name, p["title"], t["expr"])


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
