"""Metric names used by deploy/observability's dashboards and alert rules (shared by the tests)."""
from __future__ import annotations

import json
import pathlib
import re

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy" / "observability"
RULES = DEPLOY / "prometheus" / "rules" / "cuty.rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tests" / "cuty.rules.test.yml"
# Our metrics start with these; the label names that share the prefixes are not metrics.
_NAME = re.compile(r"\b((?:cuty|rpc|http)_[a-zA-Z0-9_]+)\b")
_LABELS = {"rpc_service", "rpc_method", "rpc_system", "rpc_response_status_code", "http_request_method",
           "http_route", "http_response_status_code"}
_SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def expressions() -> dict[str, list[str]]:
    """File name -> the PromQL it holds (dashboard targets; the rule file's text, which is all expressions
    apart from names and annotations that mention no metric)."""
    out = {f.name: [t["expr"] for p in json.loads(f.read_text())["panels"] for t in p.get("targets", [])]
           for f in sorted((DEPLOY / "dashboards").glob("*.json"))}
    out[RULES.name] = [line for line in RULES.read_text().splitlines() if not line.lstrip().startswith("#")]
    return out


def family(name: str) -> str:
    for s in _SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def metric_families() -> dict[str, set[str]]:
    """Metric family -> the files that use it."""
    used: dict[str, set[str]] = {}
    for fname, exprs in expressions().items():
        for e in exprs:
            for name in _NAME.findall(e):
                if name not in _LABELS:
                    used.setdefault(family(name), set()).add(fname)
    return used


# Every module that defines metrics on prometheus_client's default registry, which each process
# serves. Importing them all in one process gives the names the platform exports (a name added to a
# dashboard or a rule must be defined in one of them; tests/e2e/observability checks a live stack).
EXPORTING_MODULES = ("cutylib.metrics", "cutylib.grpc_metrics", "booking.metrics", "codepool.metrics",
                     "payments.metrics", "payments.psp", "gateway.access", "gateway.admission")
# Series Prometheus itself writes for every target.
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def exported_families() -> set[str]:
    import importlib

    import prometheus_client

    for module in EXPORTING_MODULES:
        importlib.import_module(module)
    # Registered on first use, in the processes that deliver merchant webhooks (and redeliver them).
    from payments.outbound.metrics import process_metrics, process_redelivery_metrics

    process_metrics()
    process_redelivery_metrics()
    names = {f.name for f in prometheus_client.REGISTRY.collect()}
    # The gauges read from the database are collected only on the metrics leader (Metrics.db_gauge);
    # this process may have stood down in an earlier test: they are defined all the same.
    for collector in list(getattr(prometheus_client.REGISTRY, "_collector_to_names", {})):
        names |= {m.name for g in getattr(collector, "gauges", ()) for m in g.describe()}
    return names


_RECORDED = re.compile(r"\b([a-z_]+:[a-zA-Z0-9_:]+)\b")


def recorded_names() -> tuple[set[str], set[str]]:
    """(names the rule file's recording rules define, recording-rule-style names it and the dashboards use)."""
    import yaml

    groups = yaml.safe_load(RULES.read_text())["groups"]
    defined = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    used = {n for exprs in expressions().values() for e in exprs for n in _RECORDED.findall(e)
            if not n.startswith(("http:", "https:"))}
    return defined, used
