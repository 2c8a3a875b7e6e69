"""The project's docker-compose.yml on a real Docker daemon, with no image registry.

Used by tests/system/test_docker_stack.py. What it substitutes, and nothing else:

* images: prom/prometheus and prom/alertmanager by Debian's packages in an image
  (tests/docker/prometheus.Dockerfile), ghcr.io/ggml-org/llama.cpp by the CPU llama-server
  `make install` built (tests/docker/llama-server.Dockerfile), busybox by the debootstrapped
  base (scripts/install-docker.sh); the project's own images are built from its Dockerfile
  with that base as LLMB_BASE_IMAGE;
* the NVIDIA device reservations: compose 1.29 cannot drop a device list through an
  override file, so `docker-compose config` renders the project's file and the rendered
  copy loses `deploy.resources.reservations.devices` (a CPU host has no NVIDIA runtime);
* the default network is marked `internal: true` (no route out; published ports are then
  unreachable, so every API is read from inside, through `docker exec` in a container on
  the network);
* Grafana is left out: no Grafana image or binary is reachable here (its dashboards are
  checked by grafana-foundation-sdk and by every query running on the real Prometheus,
  tests/integration/test_grafana.py and tests/system/test_stack_integration.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
# Debian's docker.io CLI, the same release as the daemon it starts.
DOCKER = "/usr/bin/docker"
PROMETHEUS_IMAGE = "llmb-test/prometheus:debian"
ALERTMANAGER_IMAGE = "llmb-test/alertmanager:debian"
LLAMA_IMAGE = "llmb-test/llama-server:cpu"
PROJECT_IMAGES = ("llm-bottleneck-exporter:0.1.0", "llm-bottleneck:0.1.0")
HOST_LABEL = "docker-stack-test"


def run(argv: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """Run a command; fail with its output when it fails."""
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False
    )
    if proc.returncode != 0:
        output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{output}")
    return proc.stdout


def install_docker() -> str:
    """Debian's docker.io + docker-compose, a running dockerd, the base image; its name."""
    script = str(ROOT / "scripts" / "install-docker.sh")
    run(["bash", script], timeout=1200)
    return run(["bash", script, "--print"]).strip()


def docker(*args: str, timeout: float = 600) -> str:
    return run([DOCKER, *args], timeout=timeout)


def build_images(base: str, env: dict[str, str]) -> dict[str, float]:
    """Every image the stack needs, built locally; seconds per build."""
    from tests.plugins.llama import find_llama_server

    took: dict[str, float] = {}
    context = str(ROOT / "tests" / "docker")
    for target, tag in (("prometheus", PROMETHEUS_IMAGE), ("alertmanager", ALERTMANAGER_IMAGE)):
        start = time.monotonic()
        docker(
            "build", "-q", "--build-arg", f"BASE_IMAGE={base}", "--target", target,
            "-t", tag, "-f", f"{context}/prometheus.Dockerfile", context,
        )  # fmt: skip
        took[target] = time.monotonic() - start
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "app"
        shutil.copytree(find_llama_server().parent, bin_dir, symlinks=True)
        docker(
            "build", "-q", "--build-arg", f"BASE_IMAGE={base}", "-t", LLAMA_IMAGE,
            "-f", f"{context}/llama-server.Dockerfile", str(bin_dir),
        )  # fmt: skip
    took["llama-server"] = time.monotonic() - start
    start = time.monotonic()
    # The project's own Dockerfile through compose, with the base as LLMB_BASE_IMAGE.
    run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "build", "exporter", "demo"],
        timeout=1800, env=env)  # fmt: skip
    took["project"] = time.monotonic() - start
    return took


def pip_layer_bytes(image: str) -> int:
    """Size of the image's `pip install` layer (what the project adds to its base)."""
    out = docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", image)
    sizes = [line.split("\t", 1)[0] for line in out.splitlines() if "pip install" in line]
    assert len(sizes) == 1, out
    return _parse_size(sizes[0])


def _parse_size(text: str) -> int:
    units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * units[unit])
    raise AssertionError(f"size {text!r}")


def render(env: dict[str, str], base: str, profiles: list[str]) -> dict[str, Any]:
    """`docker-compose config` of the project's file, images and devices substituted."""
    argv = ["docker-compose", "-f", str(ROOT / "docker-compose.yml")]
    for profile in profiles:
        argv += ["--profile", profile]
    doc: dict[str, Any] = yaml.safe_load(run([*argv, "config"], env=env))
    substitute = {
        "prometheus": PROMETHEUS_IMAGE,
        "alertmanager": ALERTMANAGER_IMAGE,
        "llamacpp": LLAMA_IMAGE,
        "loadgen-out": base,
        "llamacpp-logrotate": base,
    }
    services: dict[str, Any] = doc["services"]
    services.pop("grafana")
    for name, service in services.items():
        if name in substitute:
            service["image"] = substitute[name]
        reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
        reservations.pop("devices", None)
        service.pop("build", None)
    doc.setdefault("networks", {}).setdefault("default", {})
    doc["networks"]["default"]["internal"] = True
    return doc


@dataclass
class Stack:
    """One compose project from rendered files; every API read from inside its network."""

    project: str
    workdir: Path
    env: dict[str, str]
    base: str
    pids: set[int] = field(default_factory=set)

    def compose(self, profiles: list[str], *args: str, timeout: float = 600) -> str:
        doc = render(self.env, self.base, profiles)
        path = self.workdir / f"compose-{'-'.join(profiles) or 'default'}.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        argv = ["docker-compose", "-p", self.project, "-f", str(path)]
        for profile in profiles:
            argv += ["--profile", profile]
        return run([*argv, *args], timeout=timeout, env=self.env)

    def container(self, service: str, stopped: bool = False) -> str:
        """The id of the service's one container (running, or also stopped)."""
        out = docker(
            "ps", "-q", *(["-a"] if stopped else []),
            "--filter", f"label=com.docker.compose.project={self.project}",
            "--filter", f"label=com.docker.compose.service={service}",
        )  # fmt: skip
        ids = out.split()
        assert len(ids) == 1, (service, ids)
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        doc: list[dict[str, Any]] = json.loads(docker("inspect", self.container(service)))
        if doc[0]["State"]["Pid"]:
            self.pids.add(int(doc[0]["State"]["Pid"]))
        return doc[0]

    def fetch(self, url: str) -> str:
        """GET `url` from inside the network (wget in the Prometheus container)."""
        return docker("exec", self.container("prometheus"), "wget", "-qO-", url, timeout=60)

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.quote(expr)
        doc = json.loads(self.fetch(f"http://127.0.0.1:9090/api/v1/query?query={q}"))
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def api(self, url: str) -> Any:
        return json.loads(self.fetch(url))

    def alertmanager_alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("http://alertmanager:9093/api/v2/alerts")
        return alerts

    def wait_for_alert(self, alertname: str, engine: str, timeout: float) -> dict[str, Any]:
        """The first `alertname{engine=...}` that reaches Alertmanager within `timeout`."""

        def named() -> list[dict[str, Any]]:
            return [
                a
                for a in self.alertmanager_alerts()
                if a["labels"].get("alertname") == alertname and a["labels"].get("engine") == engine
            ]

        found: list[dict[str, Any]] = wait_for(
            named, timeout, f"{alertname}{{engine={engine}}} in Alertmanager"
        )
        return found[0]

    def wait_healthy(self, services: list[str], timeout: float = 240) -> None:
        """Every service healthy (its own healthcheck), none restarted."""
        deadline = time.monotonic() + timeout
        while True:
            states = {s: self.inspect(s)["State"] for s in services}
            health = {s: st.get("Health", {}).get("Status") for s, st in states.items()}
            if all(h == "healthy" for h in health.values()):
                break
            assert time.monotonic() < deadline, f"not healthy in {timeout}s: {health}"
            time.sleep(3)
        for service in services:
            assert self.inspect(service)["RestartCount"] == 0, service

    def down(self) -> None:
        """Down with volumes; assert nothing of the project is left."""
        self.compose(["llamacpp", "demo", "loadgen", "host"], "down", "-v", "--remove-orphans")
        label = f"label=com.docker.compose.project={self.project}"
        assert docker("ps", "-aq", "--filter", label).split() == []
        assert docker("network", "ls", "-q", "--filter", label).split() == []
        assert docker("volume", "ls", "-q", "--filter", label).split() == []
        left = [pid for pid in self.pids if Path(f"/proc/{pid}").exists()]
        assert left == [], f"processes of the stack still running: {left}"


def wait_for(check: Callable[[], Any], timeout: float, what: str, step: float = 3) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(step)


def compose_env(models_dir: Path, out_dir: Path, base: str) -> dict[str, str]:
    """The environment of every docker-compose call: the user's variables, test values."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {
        **keep,
        "GRAFANA_ADMIN_PASSWORD": "test-only-password",
        "LLMB_BASE_IMAGE": base,
        "LLMB_HOST": HOST_LABEL,
        # No NVIDIA GPU here (its device reservation is stripped too): NVML would fail and,
        # after 5 minutes, LLMExporterSourceFailing would rightly fire.
        "LLMB_GPU_ENABLED": "false",
        "MODELS_DIR": str(models_dir),
        "LOADGEN_OUT_DIR": str(out_dir),
        "LOADGEN_UID": str(os.getuid()),
        "LOADGEN_GID": str(os.getgid()),
        # The CPU build on 2 cores: a small context, and no AMX repack (tests/conftest.py).
        "LLAMACPP_CTX": "4096",
        "LLAMACPP_EXTRA_ARGS": "--no-repack -t 2",
        "COMPOSE_HTTP_TIMEOUT": "300",
    }
