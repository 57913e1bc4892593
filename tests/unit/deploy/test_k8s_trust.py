"""The Kubernetes deployment keeps the trust model (docs/security.md): each pod holds only its own
secrets and certificate, and the network denies everything the design does not draw."""
import pathlib
import shutil
import subprocess

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
SERVICES = ("gateway", "booking", "codepool", "payments")
OWN_SECRETS = {"gateway": {"cuty-gateway-secrets", "cuty-gateway-assertion-key", "gateway-tls"},
               "booking": {"booking-tls", "cuty-booking-db-app"},
               "codepool": {"cuty-codepool-secrets", "codepool-tls", "cuty-codepool-db-app"},
               "payments": {"cuty-payments-secrets", "payments-tls", "cuty-payments-db-app"}}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with kustomize) is not installed: install kubectl to render deploy/k8s")
    out = subprocess.run([kubectl, "kustomize", str(REPO / "deploy" / "k8s")], check=True, capture_output=True,
                         text=True).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def secrets_used(deployment: dict) -> set[str]:
    spec = deployment["spec"]["template"]["spec"]
    names = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    for c in spec["containers"]:
        names |= {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
        names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                  if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
    return names


def env_of(deployment: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])}


def test_each_service_mounts_only_its_own_secrets(objects):
    deployments = by_kind(objects, "Deployment")
    assert set(deployments) == set(SERVICES)
    for name, d in deployments.items():
        assert secrets_used(d) == OWN_SECRETS[name], name
    secrets = by_kind(objects, "Secret")
    assert "cuty-secrets" not in secrets  # the one Secret every pod received is gone
    assert "CUTY_PSP_WEBHOOK_SECRET" in secrets["cuty-payments-secrets"]["stringData"]
    assert "CUTY_CODE_KEYS" in secrets["cuty-codepool-secrets"]["stringData"]
    assert not {"CUTY_PSP_WEBHOOK_SECRET", "CUTY_CODE_KEYS"} & set(secrets["cuty-gateway-secrets"]["stringData"])


def test_every_service_speaks_mutual_tls_with_its_own_certificate(objects):
    certs = by_kind(objects, "Certificate")
    for name, d in by_kind(objects, "Deployment").items():
        env = env_of(d)
        assert env["CUTY_TLS_CERT"] and env["CUTY_TLS_KEY"] and env["CUTY_TLS_CA"], name
        assert certs[f"{name}-tls"]["spec"]["dnsNames"][0] == name  # the identity in the SAN
        assert ("CUTY_USER_ASSERTION_KEY" in env) == (name == "gateway")  # only the gateway signs users
        if name != "gateway":
            port = env[f"CUTY_{name.upper()}_HEALTH_PORT"]
            probe = d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"]
            assert str(probe) == port  # kubelet probes the plaintext health port, not the TLS one
    config = by_kind(objects, "ConfigMap")["cuty-config"]["data"]
    assert config["CUTY_ENV"] == "production" and "CUTY_TLS" not in config


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
                    out.add(labels.get("app") or labels.get("cnpg.io/cluster") or "?")
        return out

    assert peers("booking", "ingress", 50051) == {"gateway", "payments"}
    assert peers("codepool", "ingress", 50052) == {"gateway", "payments"}
    assert peers("payments", "ingress", 50053) == {"gateway"}
    assert peers("gateway", "egress", 50051) == {"booking"} and peers("gateway", "egress", 50053) == {"payments"}
    assert peers("payments", "egress", 50051) == {"booking"} and peers("payments", "egress", 50052) == {"codepool"}
    for svc in ("booking", "codepool", "payments"):
        assert peers(svc, "egress", 5432) == {f"cuty-{svc}-db"}  # its own database, no other
        assert peers(f"{svc}-db", "ingress", 5432) >= {svc}
        assert not (peers(f"{svc}-db", "ingress", 5432) & ({"booking", "codepool", "payments", "gateway"} - {svc}))
