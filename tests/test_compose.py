"""docker-compose.yml: validated by a real compose implementation, every variable documented."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
SERVICES = {
    "exporter",
    "prometheus",
    "alertmanager",
    "grafana",
    "loadgen",
    "llamacpp",
    "sglang",
    "demo",
}
PROFILES = {"loadgen": "loadgen", "llamacpp": "llamacpp", "sglang": "sglang", "demo": "demo"}


def compose_vars() -> set[str]:
    """Every ${VAR...} the compose file reads ($$ is a literal dollar, not a variable)."""
    text = COMPOSE.read_text(encoding="utf-8").replace("$$", "")
    return set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))


def docker_compose(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run Debian's docker-compose (it validates without a Docker daemon)."""
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (Debian package docker-compose)"
    clean = {k: v for k, v in os.environ.items() if k not in compose_vars()}
    return subprocess.run(
        [binary, "-f", str(COMPOSE), *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    result = docker_compose({"GRAFANA_ADMIN_PASSWORD": "test-only-password"}, "config")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = yaml.safe_load(result.stdout)
    return doc


def raw() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return doc


def test_compose_config_check_passes(rendered: dict[str, Any]) -> None:
    assert set(rendered["services"]) == SERVICES


def test_grafana_password_has_no_usable_default() -> None:
    result = docker_compose({}, "config")
    assert result.returncode != 0
    assert "set GRAFANA_ADMIN_PASSWORD in .env" in result.stderr
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert re.search(r"^GRAFANA_ADMIN_PASSWORD=$", example, flags=re.M)


def test_every_variable_is_documented() -> None:
    used = compose_vars()
    assert "GRAFANA_ADMIN_PASSWORD" in used
    example = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", (ROOT / ".env.example").read_text(), re.M))
    deploy = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([A-Z_][A-Z0-9_]*)` \|", deploy, flags=re.M))
    assert used - example == set(), "missing in .env.example"
    assert used - documented == set(), "missing in docs/deploy.md"
    assert example - used == set(), ".env.example documents variables compose never reads"


def test_every_mounted_file_exists() -> None:
    for name, service in raw()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            default = re.fullmatch(r"\$\{[A-Z_]+:-(.+)\}", source)
            if default:
                source = default.group(1)
            if not source.startswith("."):
                continue  # a named volume
            if source in {"./models", "./out"}:
                continue  # the user's own folders, created by docker when missing
            assert (ROOT / source).exists(), (name, volume)


def test_prometheus_gets_the_shipped_rules_and_config(rendered: dict[str, Any]) -> None:
    volumes = rendered["services"]["prometheus"]["volumes"]
    text = "\n".join(str(v) for v in volumes)
    assert "prometheus/prometheus.yml:/etc/prometheus/prometheus.yml" in text
    assert "prometheus/rules:/etc/prometheus/rules" in text
    assert "prometheus-data:/prometheus" in text


def test_profiles_and_defaults() -> None:
    services = raw()["services"]
    for name, service in services.items():
        assert service.get("profiles", []) == ([PROFILES[name]] if name in PROFILES else []), name


def test_exporter_gets_the_gpu_utility_capability_and_host_pids() -> None:
    exporter = raw()["services"]["exporter"]
    assert exporter["pid"] == "host"
    devices = exporter["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["utility"]


def test_images_are_pinned_and_ports_bind_to_loopback() -> None:
    example = dict(
        re.findall(r"^([A-Z_][A-Z0-9_]*)=(.*)$", (ROOT / ".env.example").read_text(), re.M)
    )
    for name, service in raw()["services"].items():
        image = service["image"]
        tag = image.rsplit(":", 1)[1]
        default = re.fullmatch(r"\$\{[A-Z_]+:-(.+)\}", tag)
        tag = default.group(1) if default else tag
        assert tag and tag != "latest" and "$" not in tag, (name, image)
        for port in service.get("ports", []):
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), (name, port)
    assert example["BIND_ADDRESS"] == "127.0.0.1"


def test_long_running_services_have_healthchecks() -> None:
    for name, service in raw()["services"].items():
        if name == "loadgen":
            continue  # runs on demand and exits
        assert service["healthcheck"]["test"], name


def test_engines_expose_metrics() -> None:
    services = raw()["services"]
    assert "--metrics" in services["llamacpp"]["command"]
    assert "--enable-metrics" in services["sglang"]["command"]
    assert "ghcr.io/ggml-org/llama.cpp:" in services["llamacpp"]["image"]
    assert "server-cuda" in services["llamacpp"]["image"] + str((ROOT / ".env.example").read_text())
    assert services["sglang"]["image"].startswith("lmsysorg/sglang:")


def test_dockerfile_installs_the_project_as_a_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:[\d.]+-slim", text, flags=re.M)
    assert "pip install /src" in text
    user = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert user and user[-1] not in {"root", "0"}
