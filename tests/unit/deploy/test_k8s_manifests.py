"""Offline checks of deploy/k8s: every overlay renders with `kubectl kustomize`;
core objects validate strictly (kubernetes-validate); custom resources (CloudNativePG,
cert-manager) validate against their vendored CRD schemas with unknown fields refused; and the
policies the design asks for hold: probes, resources, restricted security, pinned images, headless
gRPC Services, each pod only its own secrets, a network that denies by default."""
from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate
import pytest
import yaml

# Each test renders and validates the manifests on its own: parallel workers may split the file.
pytestmark = pytest.mark.spread

REPO = pathlib.Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
COMPONENTS = ("prometheus-operator", "grafana-dashboards", "tracing", "approver-policy", "internal-client",
              "internal-client/approver-policy")
KUBERNETES_VERSION = "1.32.0"
SERVICES = ("gateway", "booking", "codepool", "payments")
GRPC_BACKENDS = ("booking", "codepool", "payments")
# Processes beside the services: the merchants' webhook delivery workers (python -m payments webhooks-out).
WORKERS = ("payments-webhooks-out",)
OWN_SECRETS = {"gateway": {"cuty-gateway-secrets", "cuty-gateway-assertion-key", "gateway-tls"},
               "booking": {"booking-tls", "cuty-booking-db-app"},
               "codepool": {"cuty-codepool-secrets", "codepool-tls", "cuty-codepool-db-app"},
               "payments": {"cuty-payments-secrets", "payments-tls", "cuty-payments-db-app"},
               # of payments' secrets, the endpoint secrets' keyring alone (test_webhooks_out_...)
               # and its own database role's password, never the owner's (cuty-payments-db-app)
               "payments-webhooks-out": {"cuty-payments-secrets", "cuty-payments-db-webhooks-out"}}


@functools.cache
def render(overlay: str, components: tuple[str, ...] = ()) -> list[dict]:
    """The overlay's objects; with `components`, as an overlay that adds them would render it."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with kustomize) is not installed: install kubectl to render deploy/k8s")
    with tempfile.TemporaryDirectory() as tmp:
        root = K8S / "overlays" / overlay
        if components:  # kustomize takes relative paths only
            rel = lambda p: os.path.relpath(p, tmp)  # noqa: E731
            pathlib.Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [rel(root)], "components": [rel(K8S / "components" / c) for c in components]}))
            root = pathlib.Path(tmp)
        out = subprocess.run([kubectl, "kustomize", str(root)], check=True, capture_output=True, text=True).stdout
    return [o for o in yaml.safe_load_all(out) if o]


# Every overlay alone, and with every component (an overlay may add any of them).
RENDERINGS = [(o, ()) for o in OVERLAYS] + [(o, COMPONENTS) for o in OVERLAYS]


@pytest.fixture(params=RENDERINGS, ids=lambda r: r[0] + ("+components" if r[1] else ""))
def objects(request) -> list[dict]:
    return render(*request.param)


def by_kind(objects, kind, namespace: str | None = None) -> dict[str, dict]:
    out = {o["metadata"]["name"]: o for o in objects if o["kind"] == kind
           and namespace in (None, o["metadata"].get("namespace"))}
    assert namespace or len(out) == sum(o["kind"] == kind for o in objects), f"two {kind}s of one name"
    return out


# --- schemas -------------------------------------------------------------------------------------

def _strict(schema: dict) -> dict:
    """A CRD schema with unknown fields refused where the API server would prune them."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and "(?i)" in pattern[1:]:
            # Go's RE2 takes a flag group anywhere (the Prometheus Operator writes `^(?i)...`);
            # Python only at the start, where it means the same.
            schema["pattern"] = "(?i)" + pattern.replace("(?i)", "")
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in (K8S / "schemas").rglob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            schema = _strict(v["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object"}
            out[(f"{group}/{v['name']}", kind)] = schema
    return out


@functools.cache
def crd_validator(key: tuple[str, str]):
    schema = crd_schemas()[key]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_every_object_validates(objects):
    custom = 0
    for o in objects:
        key = (o["apiVersion"], o["kind"])
        if key in crd_schemas():
            crd_validator(key).validate(o)
            custom += 1
        else:
            kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
    assert custom >= 8  # clusters, certificates, issuer (and in prod poolers, scheduled backups)


def test_the_schema_check_bites():
    cluster = {"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster", "metadata": {"name": "x"},
               "spec": {"instances": 3, "storage": {"size": "1Gi"}, "instancess": 3}}
    with pytest.raises(jsonschema.ValidationError, match="instancess"):
        jsonschema.validate(cluster, crd_schemas()[("postgresql.cnpg.io/v1", "Cluster")])
    with pytest.raises(Exception):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
                                      "spec": {"clusterIp": "None"}}, KUBERNETES_VERSION, strict=True)


# --- policies ------------------------------------------------------------------------------------

def containers(o: dict) -> list[dict]:
    return o["spec"]["template"]["spec"]["containers"]


def test_deployments_are_probed_sized_locked_down_and_pinned(objects):
    deployments = by_kind(objects, "Deployment")
    assert set(by_kind(objects, "Deployment", "cuty")) == set(SERVICES) | set(WORKERS)
    for name, d in deployments.items():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["topologySpreadConstraints"], name
        for c in containers(d):
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c, (name, probe)
            assert c["resources"]["requests"] and c["resources"]["limits"], name
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True \
                and sc["capabilities"]["drop"] == ["ALL"], name
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1] or "@sha256:" in image, (name, image)
            assert not image.endswith(":latest"), (name, image)
        if name in GRPC_BACKENDS + WORKERS:
            c = containers(d)[0]
            # Liveness is the process's own (health name "liveness"); readiness follows the database.
            assert c["livenessProbe"]["grpc"]["service"] == "liveness"
            assert "service" not in c["readinessProbe"]["grpc"]
    for job in by_kind(objects, "Job").values():
        assert containers(job)[0]["args"][-1] == "migrate"
        assert 0 < job["spec"]["activeDeadlineSeconds"] <= 3600  # never runs on unseen


def test_namespace_enforces_the_restricted_pod_security_profile(objects):
    labels = by_kind(objects, "Namespace")["cuty"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_gateway_reaches_the_identity_provider_and_nothing_else_outside(objects):
    """Token checks fetch the JWKS over HTTPS: one egress rule to an address block, not the internet."""
    spec = by_kind(objects, "NetworkPolicy")["gateway"]["spec"]
    outside = [r for r in spec["egress"] if any("ipBlock" in peer for peer in r["to"])]
    (rule,) = outside
    assert rule["ports"] == [{"protocol": "TCP", "port": 443}]
    for peer in rule["to"]:
        prefix = int(peer["ipBlock"]["cidr"].split("/")[1])
        assert prefix >= 16, peer  # a provider's range, never 0.0.0.0/0


def test_grpc_backends_are_headless_and_dialled_by_dns(objects):
    services = by_kind(objects, "Service")
    for name in GRPC_BACKENDS:
        assert services[name]["spec"]["clusterIP"] == "None", name
    env = {e["name"]: e.get("value") for e in containers(by_kind(objects, "Deployment")["gateway"])[0]["env"]}
    for name in GRPC_BACKENDS:
        assert env[f"CUTY_{name.upper()}_ADDR"].startswith("dns:///"), name
    config = by_kind(objects, "ConfigMap")["cuty-config"]["data"]
    assert config["CUTY_MIGRATE_ON_START"] == "false" and config["CUTY_ENV"] == "production"


def test_no_secret_values_in_any_overlay(objects):
    assert by_kind(objects, "Secret") == {}  # `kubectl apply -k` never overwrites real secrets


def secrets_used(deployment: dict) -> set[str]:
    spec = deployment["spec"]["template"]["spec"]
    names = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    for c in spec["containers"]:
        names |= {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
        names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                  if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
    return names


def test_each_service_mounts_only_its_own_secrets_and_certificate(objects):
    certs = by_kind(objects, "Certificate")
    for name, d in by_kind(objects, "Deployment", "cuty").items():
        assert secrets_used(d) == OWN_SECRETS[name], name
        if name in WORKERS:
            continue  # no certificate at all: test_webhooks_out_...
        env = {e["name"]: e.get("value") for e in containers(d)[0]["env"]}
        assert env["CUTY_TLS_CERT"] and env["CUTY_TLS_KEY"] and env["CUTY_TLS_CA"], name
        assert certs[f"{name}-tls"]["spec"]["dnsNames"][0] == name  # the identity in the SAN
        assert ("CUTY_USER_ASSERTION_KEY" in env) == (name == "gateway")  # only the gateway signs users
        # The certificate's Secret is mounted whole (no subPath), so cert-manager's renewal reaches the
        # running pod's files, which it re-reads (cutylib.tls.CertificateFiles; docs/security.md, "Rotation").
        (tls,) = [m for m in containers(d)[0]["volumeMounts"] if m["mountPath"] == env["CUTY_TLS_CERT"].rsplit("/", 1)[0]]
        assert "subPath" not in tls and tls["readOnly"], name
        (volume,) = [v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == tls["name"]]
        assert volume["secret"]["secretName"] == f"{name}-tls", name


def test_network_denies_by_default_and_allows_the_designed_edges(objects):
    policies = by_kind(objects, "NetworkPolicy")
    deny = policies["default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"} \
        and "ingress" not in deny and "egress" not in deny

    def peers(policy: str, direction: str, port: int) -> set[str]:
        out = set()
        for rule in policies[policy]["spec"].get(direction, []):
            if any(p["port"] == port for p in rule.get("ports", [])):
                for peer in rule.get("from" if direction == "ingress" else "to", []):
                    labels = peer.get("podSelector", {}).get("matchLabels", {})
                    namespace = peer.get("namespaceSelector", {}).get("matchLabels", {})
                    out.add(labels.get("app") or labels.get("cnpg.io/cluster")
                            or namespace.get("kubernetes.io/metadata.name") or "?")
        return out

    assert peers("booking", "ingress", 50051) == {"gateway", "payments"}
    assert peers("codepool", "ingress", 50052) == {"gateway", "payments"}
    assert peers("payments", "ingress", 50053) == {"gateway"}
    assert peers("gateway", "egress", 50051) == {"booking"} and peers("gateway", "egress", 50053) == {"payments"}
    assert peers("payments", "egress", 50051) == {"booking"} and peers("payments", "egress", 50052) == {"codepool"}
    for svc in GRPC_BACKENDS:
        assert peers(svc, "egress", 5432) == {f"cuty-{svc}-db"}  # its own database, no other
        assert peers(f"{svc}-migrate", "egress", 5432) == {f"cuty-{svc}-db"}
        assert peers(f"{svc}-db", "ingress", 5432) == {svc, f"{svc}-migrate", "cnpg-system"} | \
            ({"payments-webhooks-out"} if svc == "payments" else set())


def test_webhooks_out_runs_alone_with_the_least_it_needs(objects):
    """The merchants' webhook delivery workers: their own Deployment, identity, memory limit and
    network (DNS, the payments database, HTTPS outside the cluster, nothing else; in, the probes and
    Prometheus on its metrics port); the payments
    Deployment runs none of them."""
    deployments = by_kind(objects, "Deployment")
    d = deployments["payments-webhooks-out"]
    pod, (c,) = d["spec"]["template"]["spec"], containers(d)
    assert c["args"] == ["python", "-m", "payments", "webhooks-out"]
    assert c["image"] == containers(deployments["payments"])[0]["image"]  # the same image
    assert pod["serviceAccountName"] == "payments-webhooks-out" and pod["serviceAccountName"] not in \
        {p["spec"]["template"]["spec"]["serviceAccountName"] for n, p in deployments.items() if n != d["metadata"]["name"]}
    sa = by_kind(objects, "ServiceAccount")["payments-webhooks-out"]
    assert sa["automountServiceAccountToken"] is False
    assert c["resources"]["limits"]["memory"] == "256Mi"
    env = {e["name"]: e for e in c["env"]}
    # no certificate, no user-assertion key; of payments' secrets only the endpoint secrets' keyring
    assert not {"CUTY_TLS_CERT", "CUTY_TLS_KEY", "CUTY_USER_ASSERTION_PUBLIC_KEYS"} & set(env)
    assert not pod.get("volumes", []) or all("secret" not in v and "configMap" not in v for v in pod["volumes"])
    assert not [e for e in c.get("envFrom", []) if "secretRef" in e]
    assert env["CUTY_WEBHOOK_SECRET_KEYS"]["valueFrom"]["secretKeyRef"] == \
        {"name": "cuty-payments-secrets", "key": "CUTY_WEBHOOK_SECRET_KEYS"}
    payments_env = {e["name"]: e.get("value") for e in containers(deployments["payments"])[0]["env"]}
    assert payments_env["CUTY_WEBHOOKS_OUT_WORKERS"] == "0"
    # its own database role, declared on the payments cluster with the password it connects with
    assert env["CUTY_WEBHOOKS_OUT_DATABASE_URL"]["value"].startswith(
        "postgresql://payments_webhooks_out:$(CUTY_WEBHOOKS_OUT_DB_PASSWORD)@cuty-payments-db-rw:5432/")
    assert env["CUTY_WEBHOOKS_OUT_DB_PASSWORD"]["valueFrom"]["secretKeyRef"] == \
        {"name": "cuty-payments-db-webhooks-out", "key": "password"}
    assert "CUTY_PAYMENTS_DATABASE_URL" not in env
    cluster = by_kind(objects, "Cluster")["cuty-payments-db"]
    roles = {r["name"]: r for r in cluster["spec"]["managed"]["roles"]}
    assert roles["payments_webhooks_out"]["passwordSecret"] == {"name": "cuty-payments-db-webhooks-out"}

    policies = by_kind(objects, "NetworkPolicy", "cuty")
    mine = [p for p in policies.values()
            if p["spec"]["podSelector"] in ({}, {"matchLabels": {"app": "payments-webhooks-out"}})
            or "payments-webhooks-out" in p["spec"]["podSelector"].get("matchExpressions", [{}])[0].get("values", [])]
    # allow-prometheus: the monitoring namespace's Prometheus to the metrics port, nothing else
    assert {p["metadata"]["name"] for p in mine} == {"default-deny", "allow-dns", "allow-prometheus", "payments-webhooks-out"}
    spec = policies["payments-webhooks-out"]["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    assert [r["ports"] for r in spec["ingress"]] == [[{"protocol": "TCP", "port": 51054}]] \
        and "from" not in spec["ingress"][0]  # health probes only
    db, internet = spec["egress"]
    assert db == {"to": [{"podSelector": {"matchLabels": {"cnpg.io/cluster": "cuty-payments-db"}}}],
                  "ports": [{"protocol": "TCP", "port": 5432}]}
    assert internet["ports"] == [{"protocol": "TCP", "port": 443}]
    (block,) = internet["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(block["ipBlock"]["except"])


def test_prod_scales_survives_disruption_and_backs_up():
    objects = render("prod")
    assert set(by_kind(objects, "HorizontalPodAutoscaler")) == set(SERVICES)
    pdbs = by_kind(objects, "PodDisruptionBudget")
    poolers = by_kind(objects, "Pooler")
    assert set(pdbs) == set(SERVICES) | set(WORKERS) | set(poolers)
    for n, p in pdbs.items():
        # One pod at a time, whatever the scale; a pod that is not Ready never blocks a drain.
        selector = {"cnpg.io/poolerName": n} if n in poolers else {"app": n}
        assert p["spec"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                             "selector": {"matchLabels": selector}}, n
    assert all(p["spec"]["instances"] >= 2 for p in poolers.values())
    assert all(c["spec"].get("enablePDB", True) for c in by_kind(objects, "Cluster").values())
    # The HPAs own the services' replica counts: an apply must not reset them.
    for name, d in by_kind(objects, "Deployment", "cuty").items():
        assert ("replicas" in d["spec"]) == (name in WORKERS), name
    clusters = by_kind(objects, "Cluster")
    assert all(c["spec"]["instances"] == 3 for c in clusters.values())
    assert {p["spec"]["cluster"]["name"] for p in by_kind(objects, "Pooler").values()} == \
        {"cuty-booking-db", "cuty-codepool-db"}
    # Connection arithmetic (docs/deploy.md): at the HPA's maximum, payments' direct pools fit.
    hpa = by_kind(objects, "HorizontalPodAutoscaler")["payments"]["spec"]["maxReplicas"]
    max_conn = int(clusters["cuty-payments-db"]["spec"]["postgresql"]["parameters"]["max_connections"])
    out = by_kind(objects, "Deployment")["payments-webhooks-out"]
    out_pool = int({e["name"]: e.get("value") for e in containers(out)[0]["env"]}["CUTY_DB_POOL_MAX"])
    # CUTY_DB_POOL_MAX=20 per replica and its reporting pool (CUTY_DB_REPORTING_POOL_MAX=3), the
    # webhook delivery workers' pools, plus operator and migrations
    from cutylib.config import Settings
    assert hpa * (20 + Settings().db_reporting_pool_max) + out["spec"]["replicas"] * out_pool + 10 <= max_conn
    assert all(d["spec"]["replicas"] == 1 for d in by_kind(render("dev"), "Deployment").values())


# --- metrics in the cluster ----------------------------------------------------------------------

def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if not {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[op]:
            return False
    return True


def admitted(objects: list[dict], pod_labels: dict, port: int, port_name: str | None, namespace: str,
             peer_labels: dict) -> bool:
    """Whether some NetworkPolicy lets a pod labelled `peer_labels` in `namespace` reach `port`."""
    for p in by_kind(objects, "NetworkPolicy").values():
        spec = p["spec"]
        if "Ingress" not in spec["policyTypes"] or not selects(spec["podSelector"], pod_labels):
            continue
        for rule in spec.get("ingress", []):
            if not any(x.get("port") in (port, port_name) for x in rule.get("ports", [])):
                continue
            for peer in rule.get("from", []):
                ns = {"kubernetes.io/metadata.name": namespace}
                # a peer without a namespaceSelector is in the policy's own namespace
                ns_ok = selects(peer["namespaceSelector"], ns) if "namespaceSelector" in peer \
                    else namespace == p["metadata"]["namespace"] and "podSelector" in peer
                if ns_ok and selects(peer.get("podSelector", {}), peer_labels):
                    return True
    return False


PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus"})


def metrics_ports() -> dict[str, int]:
    """Every process's own metrics port, from the code that serves it."""
    from cutylib.metrics import METRICS_PORTS
    from payments.outbound import process

    return {**METRICS_PORTS, process.NAME: process.METRICS_PORT}


def test_every_process_declares_its_metrics_port_and_prometheus_may_reach_it(objects):
    deployments, services = by_kind(objects, "Deployment", "cuty"), by_kind(objects, "Service", "cuty")
    assert set(metrics_ports()) == set(deployments)
    for name, port in metrics_ports().items():
        pod = deployments[name]["spec"]["template"]
        declared = {p["name"]: p["containerPort"] for p in containers(deployments[name])[0]["ports"]}
        assert declared["metrics"] == port, name
        (svc_port,) = [p for p in services[name]["spec"]["ports"] if p["name"] == "metrics"]
        assert svc_port["targetPort"] == "metrics" and svc_port["port"] == port, name
        assert admitted(objects, pod["metadata"]["labels"], port, "metrics", *PROMETHEUS), name
        # ...and nobody else: the rule names its peer.
        assert not admitted(objects, pod["metadata"]["labels"], port, "metrics", "cuty", {"app": "gateway"}), name


def test_every_scraped_port_is_declared_and_admitted():
    objects = render("prod", COMPONENTS)
    monitors = by_kind(objects, "ServiceMonitor")
    assert monitors
    services, deployments = by_kind(objects, "Service", "cuty"), by_kind(objects, "Deployment", "cuty")
    scraped = set()
    for m in monitors.values():
        for svc in services.values():
            if not selects(m["spec"]["selector"], svc["metadata"].get("labels", {})):
                continue
            for endpoint in m["spec"]["endpoints"]:
                (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
                pods = [d for d in deployments.values()
                        if selects({"matchLabels": svc["spec"]["selector"]}, d["spec"]["template"]["metadata"]["labels"])]
                assert pods, svc["metadata"]["name"]
                for d in pods:
                    (cport,) = [p for c in containers(d) for p in c.get("ports", [])
                                if p.get("name") == port["targetPort"] or p["containerPort"] == port["targetPort"]]
                    assert admitted(objects, d["spec"]["template"]["metadata"]["labels"], cport["containerPort"],
                                    cport.get("name"), *PROMETHEUS), (d["metadata"]["name"], cport)
                    scraped.add(d["metadata"]["name"])
    assert scraped == set(SERVICES) | set(WORKERS)
    # The databases' exporter (CloudNativePG names its port `metrics`, 9187 on every instance).
    for pm in by_kind(objects, "PodMonitor").values():
        assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"]
        for cluster in by_kind(objects, "Cluster"):
            labels = {"cnpg.io/cluster": cluster, "cnpg.io/podRole": "instance"}
            assert selects(pm["spec"]["selector"], labels), cluster
            assert admitted(objects, labels, 9187, None, *PROMETHEUS), cluster


def test_monitors_label_the_job_as_the_local_prometheus_does():
    """Rules and dashboards name jobs `cuty-<service>` (deploy/observability/prometheus/prometheus.yml)."""
    (monitor,) = by_kind(render("prod", COMPONENTS), "ServiceMonitor").values()
    (relabel,) = monitor["spec"]["endpoints"][0]["relabelings"]
    assert relabel == {"sourceLabels": ["__meta_kubernetes_service_name"], "targetLabel": "job", "replacement": "cuty-$1"}
    local = yaml.safe_load((REPO / "deploy" / "observability" / "prometheus" / "prometheus.yml").read_text())
    assert {j["job_name"] for j in local["scrape_configs"]} >= {f"cuty-{s}" for s in SERVICES + WORKERS}


def test_generated_objects_are_the_rule_file_and_the_dashboards():
    """prometheusrule.yaml and dashboards.yaml are copies (components/generate.py), never edited apart."""
    r = subprocess.run([sys.executable, str(K8S / "components" / "generate.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    objects = render("prod", COMPONENTS)
    (rule,) = by_kind(objects, "PrometheusRule").values()
    source = yaml.safe_load((REPO / "deploy" / "observability" / "prometheus" / "rules" / "cuty.rules.yml").read_text())
    assert rule["spec"]["groups"] == source["groups"]
    boards = {p.name: json.loads(p.read_text()) for p in (REPO / "deploy" / "observability" / "dashboards").glob("*.json")}
    maps = [m for m in by_kind(objects, "ConfigMap").values() if m["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert {k: json.loads(v) for m in maps for k, v in m["data"].items()} == boards


def test_the_schema_check_bites_on_monitors():
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "x"},
               "spec": {"selector": {}, "endpoints": [{"port": "metrics", "intervall": "15s"}]}}
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        jsonschema.validate(monitor, crd_schemas()[("monitoring.coreos.com/v1", "ServiceMonitor")])


# --- migration Jobs per release ------------------------------------------------------------------

def generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "components" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_migration_jobs_are_named_for_their_migrations_and_image(overlay):
    """A Job's template cannot change: each release's Job has a name of its own (the hash of the
    service's migration files and the image it runs), so applying a new release never meets the
    previous release's finished Job; the pods and policies find it by its label."""
    gen = generator()
    jobs = by_kind(render(overlay), "Job")
    assert len(jobs) == len(GRPC_BACKENDS)
    for name, job in jobs.items():
        svc = job["metadata"]["labels"]["app"].removesuffix("-migrate")
        image = containers(job)[0]["image"]
        assert name == f"{svc}-migrate-{gen.migration_set_hash(svc, image)}", name
        assert job["spec"]["template"]["metadata"]["labels"]["app"] == f"{svc}-migrate"
        assert 0 < job["spec"]["activeDeadlineSeconds"] <= 3600


def test_the_job_name_changes_with_a_migration_or_the_image(tmp_path, monkeypatch):
    gen = generator()
    before = gen.migration_set_hash("booking", "reg/cuty:1")
    assert gen.migration_set_hash("booking", "reg/cuty:2") != before
    root = tmp_path / "services" / "booking"
    shutil.copytree(REPO / "services" / "booking" / "migrations", root / "migrations")
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.migration_set_hash("booking", "reg/cuty:1") == before
    (root / "migrations" / "0099_more.sql").write_text("SELECT 1;\n")
    assert gen.migration_set_hash("booking", "reg/cuty:1") != before


# --- databases -----------------------------------------------------------------------------------

BARMAN = "barman-cloud.cloudnative-pg.io"


def test_prod_databases_back_up_through_the_barman_cloud_plugin():
    """WAL archived by the plugin to each database's own ObjectStore, a base backup on a schedule
    and one at once; nothing uses the deprecated in-tree barmanObjectStore."""
    objects = render("prod")
    clusters, stores = by_kind(objects, "Cluster"), by_kind(objects, "ObjectStore")
    assert "barmanObjectStore" not in json.dumps(objects)
    for name, c in clusters.items():
        (plugin,) = c["spec"]["plugins"]
        assert plugin["name"] == BARMAN and plugin["isWALArchiver"] is True, name
        store = stores[plugin["parameters"]["barmanObjectName"]]
        assert store["spec"]["configuration"]["destinationPath"] == \
            f"s3://cuty-backups/{name.removeprefix('cuty-').removesuffix('-db')}"
        assert store["spec"]["retentionPolicy"]
        assert "backup" not in c["spec"]
    assert len(stores) == len(clusters)  # one each, none shared
    backups = by_kind(objects, "ScheduledBackup")
    assert {b["spec"]["cluster"]["name"] for b in backups.values()} == set(clusters)
    for name, b in backups.items():
        assert b["spec"]["method"] == "plugin" and b["spec"]["pluginConfiguration"] == {"name": BARMAN}, name
        assert b["spec"]["immediate"] is True, name  # recoverable from the first hour, not the first night
    assert "plugins" not in json.dumps(by_kind(render("dev"), "Cluster"))  # dev: no backups


def guaranteed(resources: dict) -> bool:
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    return {"cpu", "memory"} <= set(limits) and all(requests.get(k, limits[k]) == limits[k] for k in limits)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_database_pods_are_guaranteed_with_wal_on_its_own_volume(overlay):
    objects = render(overlay)
    for name, c in by_kind(objects, "Cluster").items():
        assert guaranteed(c["spec"]["resources"]), name
        assert c["spec"]["walStorage"]["size"], name
        # deprecated by CloudNativePG: the PodMonitor of components/prometheus-operator instead
        assert "enablePodMonitor" not in c["spec"].get("monitoring", {}), name
    # the plugin's sidecar runs in every instance pod: it must be Guaranteed too, or the pod is not
    for name, store in by_kind(objects, "ObjectStore").items():
        assert guaranteed(store["spec"]["instanceSidecarConfiguration"]["resources"]), name
    assert not guaranteed({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}})


def test_the_payments_ledger_commits_synchronously_in_prod():
    clusters = by_kind(render("prod"), "Cluster")
    sync = clusters["cuty-payments-db"]["spec"]["postgresql"]["synchronous"]
    assert sync == {"method": "any", "number": 1, "dataDurability": "required"}
    assert sync["number"] < clusters["cuty-payments-db"]["spec"]["instances"]
    # one instance cannot wait for a standby: never in dev
    assert "synchronous" not in by_kind(render("dev"), "Cluster")["cuty-payments-db"]["spec"]["postgresql"]


def schema_versions() -> dict[str, str]:
    """folder -> release tag, from the vendored schemas' README."""
    import re

    text = (K8S / "schemas" / "README.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)/` \|[^|]+\| [^|]*?\b(v\d+\.\d+\.\d+)\b", text, re.M)}


def test_the_documented_operators_are_the_vendored_releases():
    """docs/deploy.md installs the CloudNativePG, Barman Cloud plugin and approver-policy releases
    whose CRD schemas the checks use."""
    import re

    docs = (REPO / "docs" / "deploy.md").read_text()
    versions = schema_versions()
    cnpg = versions["cloudnative-pg"]
    minor = cnpg.removeprefix("v").rsplit(".", 1)[0]
    assert f"cloudnative-pg/release-{minor}/releases/cnpg-{cnpg.removeprefix('v')}.yaml" in docs
    assert set(re.findall(r"releases/cnpg-([\d.]+)\.yaml", docs)) == {cnpg.removeprefix("v")}
    barman = versions["plugin-barman-cloud"]
    assert set(re.findall(r"plugin-barman-cloud/releases/download/(v[\d.]+)/", docs)) == {barman}
    assert set(re.findall(r"cert-manager-approver-policy\s+--version (v[\d.]+)", docs)) == {versions["approver-policy"]}


# --- traces --------------------------------------------------------------------------------------

def test_spans_go_nowhere_without_the_tracing_component():
    for overlay in OVERLAYS:
        objects = render(overlay)
        assert by_kind(objects, "ConfigMap")["cuty-config"]["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == ""
        assert "allow-otlp" not in by_kind(objects, "NetworkPolicy")


def test_the_tracing_component_wires_the_services_to_its_collector_and_jaeger():
    objects = render("prod", ("tracing",))
    endpoint = by_kind(objects, "ConfigMap")["cuty-config"]["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    host, port = endpoint.removeprefix("http://").split(":")
    name, namespace = host.split(".")[:2]
    service = by_kind(objects, "Service", namespace)[name]
    (otlp,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    collector = by_kind(objects, "Deployment", namespace)[name]
    collector_labels = collector["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, collector_labels)
    # every service may send to it (its egress and the collector's ingress), nobody else
    for name_, d in by_kind(objects, "Deployment", "cuty").items():
        pod = d["spec"]["template"]["metadata"]["labels"]
        sends = name_ in SERVICES
        assert egress_allowed(objects, "cuty", pod, namespace, collector_labels, int(port)) == sends, name_
        assert admitted(objects, collector_labels, int(port), None, "cuty", pod) == sends, name_
    # the collector's config sends traces to the Jaeger Service of its namespace, which admits it
    config = yaml.safe_load(by_kind(objects, "ConfigMap", namespace)["otel-collector-config"]["data"]["otel-collector.yaml"])
    jaeger_host, jaeger_port = config["exporters"]["otlp/jaeger"]["endpoint"].split(":")
    jaeger = by_kind(objects, "Deployment", namespace)[jaeger_host]
    jaeger_labels = jaeger["spec"]["template"]["metadata"]["labels"]
    assert egress_allowed(objects, namespace, collector_labels, namespace, jaeger_labels, int(jaeger_port))
    assert admitted(objects, jaeger_labels, int(jaeger_port), None, namespace, collector_labels)
    assert not admitted(objects, jaeger_labels, int(jaeger_port), None, "cuty", {"app": "payments"})
    # the namespace denies by default and runs restricted pods
    policies = by_kind(objects, "NetworkPolicy", namespace)
    assert any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"] for p in policies.values())
    assert by_kind(objects, "Namespace")[namespace]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # the configs are the files `make run` uses
    assert config == yaml.safe_load((REPO / "deploy" / "observability" / "otel-collector.yaml").read_text())


def egress_allowed(objects, namespace: str, pod_labels: dict, peer_namespace: str, peer_labels: dict, port: int) -> bool:
    """Whether some NetworkPolicy of `namespace` lets the pod send to the peer's `port`."""
    for p in by_kind(objects, "NetworkPolicy", namespace).values():
        spec = p["spec"]
        if "Egress" not in spec["policyTypes"] or not selects(spec["podSelector"], pod_labels):
            continue
        for rule in spec.get("egress", []):
            if rule.get("ports") and not any(x.get("port") == port for x in rule["ports"]):
                continue
            for peer in rule.get("to", []):
                ns_ok = selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": peer_namespace}) \
                    if "namespaceSelector" in peer else peer_namespace == namespace
                if ns_ok and "podSelector" in peer and selects(peer["podSelector"], peer_labels):
                    return True
    return False


# --- certificate approval ------------------------------------------------------------------------

def hours(duration: str) -> float:
    assert duration.endswith("h"), duration
    return float(duration[:-1])


def permits(policy: dict, certificate: dict, namespace: str = "cuty") -> bool:
    """approver-policy's decision for the CertificateRequest of `certificate` (the fields used here)."""
    spec, want = policy["spec"], certificate["spec"]
    sel = spec["selector"]
    if {k: want["issuerRef"].get(k, "cert-manager.io" if k == "group" else None) for k in sel["issuerRef"]} != sel["issuerRef"] \
            or namespace not in sel["namespace"]["matchNames"]:
        return False
    allowed, constraints = spec["allowed"], spec["constraints"]
    key = want["privateKey"]
    return (want.get("commonName") == allowed["commonName"]["value"]
            and bool(want.get("dnsNames")) and set(want["dnsNames"]) <= set(allowed["dnsNames"]["values"])
            and set(want["usages"]) <= set(allowed["usages"])
            and not want.get("isCA") and not want.get("uris") and not want.get("ipAddresses")
            and hours(want["duration"]) <= hours(constraints["maxDuration"])
            and key["algorithm"] == constraints["privateKey"]["algorithm"]
            and constraints["privateKey"]["minSize"] <= key["size"] <= constraints["privateKey"]["maxSize"])


def test_each_identity_is_approved_by_its_own_policy_only():
    objects = render("prod", ("approver-policy",))
    policies, certs = by_kind(objects, "CertificateRequestPolicy"), by_kind(objects, "Certificate")
    assert set(policies) == {f"cuty-{svc}" for svc in SERVICES}
    for name, cert in certs.items():
        svc = name.removesuffix("-tls")
        assert {p for p, pol in policies.items() if permits(pol, cert)} == {f"cuty-{svc}"}, name
        assert not any(permits(pol, cert, namespace="elsewhere") for pol in policies.values())
    # what a namespace user might ask for: another identity, an extra name, a CA, a long life
    gateway = certs["gateway-tls"]
    for forged in ({"commonName": "payments"}, {"dnsNames": ["gateway", "payments"]}, {"isCA": True},
                   {"duration": "8760h"}, {"dnsNames": ["*.cuty.svc"]}, {"privateKey": {"algorithm": "RSA", "size": 2048}}):
        cert = {**gateway, "spec": {**gateway["spec"], **forged}}
        assert not any(permits(pol, cert) for pol in policies.values()), forged
    # only cert-manager's controller may use them, and only in namespace cuty
    (role,) = by_kind(objects, "ClusterRole").values()
    (rule,) = role["rules"]
    assert {**rule, "resourceNames": set(rule["resourceNames"])} == {
        "apiGroups": ["policy.cert-manager.io"], "resources": ["certificaterequestpolicies"], "verbs": ["use"],
        "resourceNames": set(policies)}
    (binding,) = by_kind(objects, "RoleBinding").values()
    assert binding["metadata"]["namespace"] == "cuty" and binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "cert-manager", "namespace": "cert-manager"}]


def test_the_schema_check_bites_on_policies():
    policy = {"apiVersion": "policy.cert-manager.io/v1alpha1", "kind": "CertificateRequestPolicy",
              "metadata": {"name": "x"}, "spec": {"selector": {"issuerRef": {}}, "allowed": {"commonNames": {}}}}
    with pytest.raises(jsonschema.ValidationError, match="commonNames"):
        jsonschema.validate(policy, crd_schemas()[("policy.cert-manager.io/v1alpha1", "CertificateRequestPolicy")])


# --- an internal client of the public gRPC API (components/internal-client) -----------------------

CLIENT = {"app": "pos"}
PUBLIC_GRPC = {("booking", 50051), ("codepool", 50052), ("payments", 50053)}


def pods_and_ports(objects) -> list[tuple[str, dict, int, str | None]]:
    """Every pod of the rendering (Deployments, Jobs, the database instances) with every port it
    serves: (name, its labels, port, the port's name)."""
    out = []
    for kind in ("Deployment", "Job"):
        for name, o in by_kind(objects, kind, "cuty").items():
            labels = o["spec"]["template"]["metadata"]["labels"]
            out += [(name, labels, p["containerPort"], p.get("name")) for c in containers(o) for p in c.get("ports", [])]
    for cluster in by_kind(objects, "Cluster", "cuty"):
        out += [(cluster, {"cnpg.io/cluster": cluster}, port, None) for port in (5432, 8000, 9187)]
    return out


def test_an_internal_client_reaches_exactly_the_public_services_grpc_ports():
    for overlay in OVERLAYS:
        objects = render(overlay, ("approver-policy", "internal-client", "internal-client/approver-policy"))
        reached = {(name, port) for name, labels, port, port_name in pods_and_ports(objects)
                   if egress_allowed(objects, "cuty", CLIENT, "cuty", labels, port)
                   and admitted(objects, labels, port, port_name, "cuty", CLIENT)}
        assert reached == PUBLIC_GRPC, overlay
        # nothing outside the cluster and no other namespace: its egress names pods of cuty only
        for policy in by_kind(objects, "NetworkPolicy", "cuty").values():
            spec = policy["spec"]
            if "Egress" in spec["policyTypes"] and selects(spec["podSelector"], CLIENT) and spec["podSelector"]:
                assert all(set(peer) == {"podSelector"} for rule in spec["egress"] for peer in rule["to"])
        # nothing reaches the client
        assert not any(admitted(objects, CLIENT, port, None, ns, labels) for port in (50051, 8080, 443)
                       for ns, labels in (("cuty", {"app": "gateway"}), ("cuty", {"app": "payments"}), PROMETHEUS))
        # the services' own callers are as before
        for svc, port in PUBLIC_GRPC:
            assert admitted(objects, {"app": svc}, port, "grpc", "cuty", {"app": "gateway"})
        # without the component no policy lets the client in
        plain = render(overlay)
        assert not any(admitted(plain, {"app": svc}, port, "grpc", "cuty", CLIENT) for svc, port in PUBLIC_GRPC)


def test_an_internal_client_is_registered_with_the_three_services_and_has_its_own_certificate():
    from cutylib import clients

    objects = render("prod", ("approver-policy", "internal-client", "internal-client/approver-policy"))
    (config,) = [m for name, m in by_kind(objects, "ConfigMap", "cuty").items() if name.startswith("cuty-internal-clients-")]
    registered = clients.parse(json.loads(config["data"]["clients.json"]))  # what the services accept at start
    assert set(registered) == {"pos"}
    for name, d in by_kind(objects, "Deployment", "cuty").items():
        pod = d["spec"]["template"]["spec"]
        (c,) = containers(d)
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        mounts = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
        if name in GRPC_BACKENDS:
            (mount,) = [m for m in c["volumeMounts"] if mounts.get(m["name"]) == config["metadata"]["name"]]
            assert env["CUTY_INTERNAL_CLIENTS"] == mount["mountPath"] + "/clients.json", name
            assert "CUTY_TLS_CA" in env  # the rest of the env list is kept
        else:
            assert "CUTY_INTERNAL_CLIENTS" not in env and config["metadata"]["name"] not in mounts.values(), name
    # issued as a service's certificate is, by the same Issuer, named as the registration says,
    # for client authentication alone; approved by its own policy only, used by cert-manager only
    certs, policies = by_kind(objects, "Certificate"), by_kind(objects, "CertificateRequestPolicy")
    cert = certs["pos-tls"]["spec"]
    assert cert["issuerRef"] == certs["booking-tls"]["spec"]["issuerRef"]
    assert cert["commonName"] == "pos" and cert["dnsNames"] == ["pos"] and "server auth" not in cert["usages"]
    assert {p for p, pol in policies.items() if permits(pol, certs["pos-tls"])} == {"cuty-pos"}
    assert not permits(policies["cuty-pos"], certs["booking-tls"])
    (role,) = by_kind(objects, "ClusterRole").values()
    assert set(role["rules"][0]["resourceNames"]) == {f"cuty-{svc}" for svc in SERVICES} | {"cuty-pos"}
