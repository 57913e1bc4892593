"""deploy/observability's collector-style configs, checked offline (no collector binary here): each
is a Collector config whose pipelines use only components it defines, whose extensions are defined,
and which wire together as documented (services -> collector -> Jaeger; collector -> Prometheus)."""
import pathlib

import pytest
import yaml

OBS = pathlib.Path(__file__).resolve().parents[3] / "deploy" / "observability"
KINDS = ("receivers", "processors", "exporters")


def load(name: str) -> dict:
    return yaml.safe_load((OBS / name).read_text())


@pytest.mark.parametrize("name", ["otel-collector.yaml", "jaeger.yaml"])
def test_pipelines_use_only_defined_components(name):
    cfg = load(name)
    pipelines = cfg["service"]["pipelines"]
    assert pipelines, name
    used = {kind: set() for kind in KINDS}
    for pipeline_name, p in pipelines.items():
        assert p.get("receivers") and p.get("exporters"), (name, pipeline_name)
        for kind in KINDS:
            for component in p.get(kind, []):
                assert component in (cfg.get(kind) or {}), f"{name}: {pipeline_name} uses undefined {kind[:-1]} {component}"
                used[kind].add(component)
    for kind in KINDS:  # nothing defined and left unused (a typo in a pipeline would show up here)
        assert set(cfg.get(kind) or {}) == used[kind], (name, kind)
    for ext in cfg["service"].get("extensions", []):
        assert ext in cfg["extensions"], (name, ext)


def test_the_wiring_matches_the_docs():
    collector, jaeger, prometheus = load("otel-collector.yaml"), load("jaeger.yaml"), load("prometheus/prometheus.yml")
    # Services send OTLP to the collector's 4317; the collector sends traces to Jaeger's OTLP receiver.
    assert collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    jaeger_port = jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1]
    assert collector["exporters"]["otlp/jaeger"]["endpoint"].endswith(":" + jaeger_port)
    assert "otlp/jaeger" in collector["service"]["pipelines"]["traces"]["exporters"]
    # Prometheus scrapes the collector's prometheus exporter and the four processes' own ports.
    port = collector["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    targets = {t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert f"127.0.0.1:{port}" in targets
    assert {f"127.0.0.1:{p}" for p in (9464, 9465, 9466, 9467)} <= targets
    # The trace store the UI reads is the one the exporter writes.
    store = jaeger["exporters"]["jaeger_storage_exporter"]["trace_storage"]
    assert store in jaeger["extensions"]["jaeger_storage"]["backends"]
    assert jaeger["extensions"]["jaeger_query"]["storage"]["traces"] == store
