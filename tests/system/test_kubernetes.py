"""The Kubernetes manifests: schema-valid (kubernetes-validate), fresh, and consistent."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from config.settings import Config, load_config
from tests.paths import ROOT

K8S = ROOT / "deploy" / "kubernetes"
VALIDATOR = Path(sys.executable).parent / "kubernetes-validate"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text(encoding="utf-8")) if d]


def _all(kind: str) -> list[dict[str, Any]]:
    return [
        d for path in sorted(K8S.glob("*.yaml")) for d in _docs(path.name) if d.get("kind") == kind
    ]


def _one(kind: str) -> dict[str, Any]:
    found = _all(kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _container(name: str) -> dict[str, Any]:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == name]
    return dict(container)


def _exporter_config(tmp_path: Path) -> Config:
    config_path = tmp_path / "config.yaml"
    config_path.write_text(_docs("configmap.yaml")[0]["data"]["config.yaml"], encoding="utf-8")
    return load_config(config_path, {"LLMB__HOST": "gpu-node-1"})


def _validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VALIDATOR), "--strict", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


# Freshness of the generated manifests: tests/system/test_mixin.py (one --check for all).


def test_core_manifests_validate_against_kubernetes_schemas() -> None:
    paths = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    result = _validate(*paths)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("INFO")}
    # Every core-API file was checked against a real schema (CRDs only get a warning).
    core = (
        "configmap.yaml",
        "rbac.yaml",
        "daemonset.yaml",
        "service.yaml",
        "grafana-dashboards.yaml",
    )
    for name in core:
        assert str(K8S / name) in passed, result.stdout


def test_validator_rejects_an_invalid_daemonset(tmp_path: Path) -> None:
    broken = _one("DaemonSet")
    broken["spec"]["template"]["spec"]["containers"][0]["gpuCount"] = 1
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken), encoding="utf-8")
    result = _validate(path)
    assert result.returncode != 0
    assert "gpuCount" in result.stdout + result.stderr


def test_kustomization_lists_every_manifest() -> None:
    kustomization = _docs("kustomization.yaml")[0]
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert len(kustomization["resources"]) == len(files)


def test_prometheus_rule_holds_exactly_the_repository_rules(tmp_path: Path) -> None:
    rule = _one("PrometheusRule")
    expected = []
    for path in sorted((ROOT / "prometheus" / "rules").glob("*.yml")):
        expected.extend(yaml.safe_load(path.read_text(encoding="utf-8"))["groups"])
    assert rule["spec"]["groups"] == expected
    names = [r.get("alert") or r.get("record") for g in expected for r in g["rules"]]
    assert names and len(names) == sum(len(g["rules"]) for g in rule["spec"]["groups"])
    # The CRD has no schema in kubernetes-validate: check the rules with promtool instead.
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian prometheus) is installed by scripts/install.sh"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_are_labelled_configmaps_of_the_repository_json() -> None:
    maps = _docs("grafana-dashboards.yaml")
    dashboards = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
    assert len(maps) == len(dashboards)
    for cm, path in zip(maps, dashboards, strict=True):
        assert cm["kind"] == "ConfigMap"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"] == {f"llmb-{path.name}": path.read_text(encoding="utf-8")}


def test_daemonset_sees_gpus_without_taking_one() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert {c["name"] for c in pod["containers"]} == {"exporter", "kube-rbac-proxy"}
    container = _container("exporter")
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["LLMB__HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    for c in pod["containers"]:
        for section in c["resources"].values():
            assert not any(key.startswith("nvidia.com/") for key in section)


def test_service_monitor_scrapes_through_the_proxy(tmp_path: Path) -> None:
    service = _one("Service")
    monitor = _one("ServiceMonitor")
    pod = _one("DaemonSet")["spec"]["template"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in port_names
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"].endswith("/serviceaccount/token")
    # The Service's port is the proxy's, and the proxy forwards to the exporter's listen.
    (target,) = {p["targetPort"] for p in service["spec"]["ports"]}
    proxy = _container("kube-rbac-proxy")
    assert target in {p["name"] for p in proxy["ports"]}
    config = _exporter_config(tmp_path)
    assert config.host == "gpu-node-1"
    assert f"--upstream=http://{config.listen}/" in proxy["args"]
    (secure,) = [a for a in proxy["args"] if a.startswith("--secure-listen-address=")]
    assert secure.endswith(f":{proxy['ports'][0]['containerPort']}")


def test_exporter_is_not_exposed_unauthenticated(tmp_path: Path) -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    # hostNetwork: anything the exporter binds is on the node. It binds the loopback only,
    # declares no port, and only kube-rbac-proxy (TLS + TokenReview/SubjectAccessReview)
    # listens on the node IP.
    assert pod["hostNetwork"] is True
    config = _exporter_config(tmp_path)
    assert config.listen_host == "127.0.0.1"
    assert "ports" not in _container("exporter")
    proxy = _container("kube-rbac-proxy")
    assert "--secure-listen-address=[$(IP)]:9490" in proxy["args"]
    (ip,) = [e for e in proxy["env"] if e["name"] == "IP"]
    assert ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "--allow-paths=/metrics" in proxy["args"]
    # Probes go to the exporter's loopback /healthz (never /metrics: no engine work).
    for probe in ("readinessProbe", "livenessProbe"):
        get = _container("exporter")[probe]["httpGet"]
        assert (get["host"], get["path"], get["port"]) == ("127.0.0.1", "/healthz", 9490)


def test_service_account_token_only_where_used() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    account = next(a for a in _all("ServiceAccount") if a["metadata"]["name"] == "llmb-exporter")
    assert pod["serviceAccountName"] == "llmb-exporter"
    assert pod["automountServiceAccountToken"] is False
    assert account["automountServiceAccountToken"] is False
    token_volumes = {
        v["name"]
        for v in pod["volumes"]
        if any("serviceAccountToken" in src for src in v.get("projected", {}).get("sources", []))
    }
    assert token_volumes == {"proxy-token"}
    mounts = {c["name"]: {m["name"] for m in c.get("volumeMounts", [])} for c in pod["containers"]}
    assert "proxy-token" in mounts["kube-rbac-proxy"]
    assert "proxy-token" not in mounts["exporter"]
    # The proxy's role can only ask who a client is and what it may do.
    role = next(r for r in _all("ClusterRole") if r["metadata"]["name"] == "llmb-exporter")
    assert sorted((r["apiGroups"][0], r["resources"][0], r["verbs"]) for r in role["rules"]) == [
        ("authentication.k8s.io", "tokenreviews", ["create"]),
        ("authorization.k8s.io", "subjectaccessreviews", ["create"]),
    ]
    (binding,) = _all("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "llmb-exporter"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "llmb-exporter", "namespace": "monitoring"}
    ]
