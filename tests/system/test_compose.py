"""docker-compose.yml: validated by a real compose implementation, every variable documented."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import ROOT
from tests.plugins.cli import wait_http

COMPOSE = ROOT / "docker-compose.yml"
SERVICES = {
    "exporter",
    "prometheus",
    "alertmanager",
    "grafana",
    "loadgen",
    "loadgen-out",
    "llamacpp",
    "llamacpp-logrotate",
    "sglang",
    "demo",
    "host-link",
    "engine-link",
}
PROFILES = {
    "loadgen": "loadgen",
    "loadgen-out": "loadgen",
    "llamacpp": "llamacpp",
    "llamacpp-logrotate": "llamacpp",
    "sglang": "sglang",
    "demo": "demo",
    "host-link": "host",
    "engine-link": "host",
}


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
    # COMPOSE_PROFILES is read by compose itself (the profiles of a plain `up -d`).
    assert example - used == {"COMPOSE_PROFILES"}, ".env.example documents unread variables"
    assert "COMPOSE_PROFILES" in documented


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
        if name in {"loadgen", "loadgen-out"}:
            continue  # run on demand and exit
        assert service["healthcheck"]["test"], name


def test_exporter_healthchecks_never_collect() -> None:
    """/healthz answers without a collection; /metrics would scrape every engine."""
    for name in ("exporter", "demo"):
        check = " ".join(raw()["services"][name]["healthcheck"]["test"])
        assert "http://127.0.0.1:9490/healthz" in check and "/metrics" not in check, name


def test_the_exporter_reads_the_models_read_only() -> None:
    services = raw()["services"]
    assert "${MODELS_DIR:-./models}:/models:ro" in services["exporter"]["volumes"]
    for engine in ("llamacpp", "sglang"):
        assert "${MODELS_DIR:-./models}:/models:ro" in services[engine]["volumes"]
    llama = profile_config("llamacpp").engines[0]
    assert (
        f"-m /models/${{LLAMACPP_MODEL:-{Path(llama.model_path).name}}}"
        in (services["llamacpp"]["command"])
    )
    sgl = profile_config("sglang").engines[0]
    assert (
        f"--model-path /models/${{SGLANG_MODEL:-{Path(sgl.model_path).name}}}"
        in (services["sglang"]["command"])
    )
    for name in ("llamacpp", "sglang", "both"):
        assert all(e.model_path for e in profile_config(name).engines), name


def test_engines_expose_metrics() -> None:
    services = raw()["services"]
    assert "--metrics" in services["llamacpp"]["command"]
    assert "--enable-metrics" in services["sglang"]["command"]
    assert "ghcr.io/ggml-org/llama.cpp:" in services["llamacpp"]["image"]
    assert "server-cuda" in services["llamacpp"]["image"] + str((ROOT / ".env.example").read_text())
    assert services["sglang"]["image"].startswith("lmsysorg/sglang:")


def test_dockerfile_installs_the_project_as_a_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG BASE_IMAGE=python:[\d.]+-slim", text, flags=re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS base$", text, flags=re.M)
    stages = dict(re.findall(r"^FROM \S+ AS (\w+)\n(.*?)(?=^FROM |\Z)", text, flags=re.M | re.S))
    # Without BuildKit every stage up to --target is built: the exporter's comes first.
    assert list(stages) == ["base", "exporter", "full"]
    # The exporter's image: base dependencies only (no extras); the full one: [full].
    assert re.search(r"^RUN pip install -c /src/constraints.txt /src ", stages["exporter"], re.M)
    assert 'pip install -c /src/constraints.txt "/src[full]"' in stages["full"]
    for stage in ("exporter", "full"):
        user = re.findall(r"^USER (\S+)", stages[stage], flags=re.M)
        assert user and user[-1] not in {"root", "0"}, stage
    services = raw()["services"]
    assert services["exporter"]["build"]["target"] == "exporter"
    for name in ("loadgen", "demo"):
        assert services[name]["build"]["target"] == "full", name
    base = "${LLMB_BASE_IMAGE:-python:3.12.7-slim-bookworm}"
    for name in ("exporter", "loadgen", "demo"):
        assert services[name]["build"]["args"] == {"BASE_IMAGE": base}, name


def test_constraints_pin_every_dependency_of_the_images() -> None:
    """constraints.txt: one exact version per package, every declared dependency included."""
    import tomllib

    lines = [
        ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln and ln[0] != "#"
    ]
    pins = dict(ln.split("==") for ln in lines)
    assert all(
        re.fullmatch(r"[a-z0-9-]+", n) and re.fullmatch(r"[\w.!+]+", v) for n, v in pins.items()
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = [*project["dependencies"], *extras["report"], *extras["synth"]]
    for req in declared:
        name = re.split(r"[<>=;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, name


def profile_config(name: str) -> Any:
    from config.settings import load_config

    return load_config(ROOT / "deploy" / "compose" / f"{name}.yaml", environ={})


def test_exporter_config_follows_the_profile() -> None:
    """Each profile's config lists only its engines, at the compose service addresses."""
    services = raw()["services"]
    expected = {
        "llamacpp": [("llama", "llamacpp", "http://llamacpp:8080")],
        "sglang": [("sgl", "sglang", "http://sglang:30000")],
        "both": [
            ("llama", "llamacpp", "http://llamacpp:8080"),
            ("sgl", "sglang", "http://sglang:30000"),
        ],
    }
    for name, engines in expected.items():
        config = profile_config(name)
        assert [(e.name, e.kind, str(e.url).rstrip("/")) for e in config.engines] == engines
    assert str(profile_config("llamacpp").engines[0].log_file) == (
        "/var/log/llama/llama-server.log"
    )
    assert "--port 8080" in services["llamacpp"]["command"]
    assert "--port 30000" in services["sglang"]["command"]
    # Plain `up -d` (no profile, no URL in .env) lists no engine; .env.example starts no
    # engine profile (a second llama-server on the port of the user's own).
    assert profile_config("gpu").engines == []
    for name in ("exporter", "loadgen"):
        volume = services[name]["volumes"][0]
        assert volume.startswith("${LLMB_CONFIG_FILE:-./deploy/compose/gpu.yaml}:"), name
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert "\nCOMPOSE_PROFILES=\nLLMB_CONFIG_FILE=./deploy/compose/gpu.yaml\n" in example
    header = COMPOSE.read_text(encoding="utf-8").split("\n\n", 1)[0]
    for config in ("gpu", "llamacpp", "sglang", "both"):
        assert f"deploy/compose/{config}.yaml" in header, config
    # No engine address is overridden behind the config's back.
    for name in ("exporter", "loadgen"):
        env = services[name].get("environment", {})
        assert not [k for k in env if k.startswith("LLMB__ENGINES__")], name


def test_llamacpp_image_supports_blackwell() -> None:
    """CUDA >= 12.8 is needed for sm_120 (RTX PRO 5000): the pinned tag is a CUDA 13 build."""
    image = raw()["services"]["llamacpp"]["image"]
    tag = re.fullmatch(r".*:\$\{LLAMACPP_IMAGE_TAG:-(.+)\}", image)
    assert tag and re.fullmatch(r"server-cuda13-b\d+", tag.group(1)), image
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert f"LLAMACPP_IMAGE_TAG={tag.group(1)}\n" in example


def test_llama_log_rotation_runs(tmp_path: Path, rendered: dict[str, Any]) -> None:
    """The rotation script, as compose renders it, run by sh over a log above the limit."""
    service = rendered["services"]["llamacpp-logrotate"]
    assert "llama-logs:/var/log/llama" in "\n".join(str(v) for v in service["volumes"])
    script = service["command"][2].replace("$$", "$")
    assert '-ge "512"' in script  # LLAMACPP_LOG_MAX_MB's default
    script = script.replace("/var/log/llama", str(tmp_path)).replace('-ge "512"', '-ge "1"')
    log = tmp_path / "llama-server.log"
    # As llama-server leaves it after an earlier rotation: a 64 MiB hole, then its lines.
    with log.open("wb") as fh:
        fh.seek(64 * 1024 * 1024)
        fh.write(b"x" * (2 * 1024 * 1024))
    proc = subprocess.Popen(["sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and log.stat().st_size:
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    assert log.stat().st_size == 0
    # Only the data: the hole is not written out as 64 MiB of NULs.
    assert (tmp_path / "llama-server.log.1").read_bytes() == b"x" * (2 * 1024 * 1024)


def test_loadgen_out_is_writable_by_its_user() -> None:
    services = raw()["services"]
    user = "${LOADGEN_UID:-1000}:${LOADGEN_GID:-1000}"
    assert services["loadgen"]["user"] == user
    assert services["loadgen-out"]["command"] == ["chown", user, "/out"]
    assert services["loadgen-out"]["user"] == "0:0"
    assert "${LOADGEN_OUT_DIR:-./out}:/out" in services["loadgen-out"]["volumes"]
    # A new folder per run: no --out, the default out/run-<time> lands in LOADGEN_OUT_DIR.
    assert "${LOADGEN_OUT_DIR:-./out}:/loadgen/out" in services["loadgen"]["volumes"]
    assert services["loadgen"]["working_dir"] == "/loadgen"
    assert "--out" not in " ".join(services["loadgen"]["entrypoint"])
    assert services["loadgen"]["depends_on"] == {
        "loadgen-out": {"condition": "service_completed_successfully"}
    }


# --- integration: the llamacpp profile's services, natively ---------------------------------


def profile_alerts(tmp_path: Path, config_file: Path) -> tuple[set[str], dict[str, str]]:
    """Run the llamacpp profile natively with `config_file` as LLMB_CONFIG_FILE.

    The llama.cpp simulator stands in for llama-server (same log, NVML-shaped GPU file);
    the exporter reads the unmodified config with the addresses compose would give it
    replaced through LLMB__ overrides, as compose's environment does; Prometheus runs
    `prometheus/prometheus.yml` with the shipped rules, its loadgen target down as in
    compose between load runs. Returns the alert names in ALERTS (pending or firing) and
    the verdict per engine, after the rules have evaluated for 20 s.
    """
    from tests.conftest import get_free_port
    from tests.plugins.prom import start_prometheus, stop_process

    procs: list[subprocess.Popen[bytes]] = []
    prom = None
    try:
        sim_port, exporter_port = get_free_port(), get_free_port()
        log, state = tmp_path / "llama-server.log", tmp_path / "gpu.json"
        argv = [sys.executable, "-m", "simulator", "--kind", "llamacpp", "--port", str(sim_port)]
        argv += ["--log-file", str(log), "--gpu-state-file", str(state)]
        with (tmp_path / "sim.out").open("wb") as out:
            procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{sim_port}/health", 30, procs[0], "llama.cpp simulator")
        from tests.unit.test_geometry import GEMMA3_27B, write_gguf

        model = write_gguf(tmp_path / "model.gguf", "gemma3", GEMMA3_27B)
        env = {
            **os.environ,
            "LLMB__LISTEN": f"127.0.0.1:{exporter_port}",
            "LLMB__HOST": "gpu-host",
            "LLMB__ENGINES__LLAMA__URL": f"http://127.0.0.1:{sim_port}",
            "LLMB__ENGINES__LLAMA__LOG_FILE": str(log),
            # A model file where compose mounts MODELS_DIR (a path not there is a source error).
            "LLMB__ENGINES__LLAMA__MODEL_PATH": str(model),
            "LLMB__ENGINES__SGL__URL": "http://127.0.0.1:30000",
            "LLMB__GPU__FAKE_FILE": f"[{state}]",
        }
        from config.settings import load_config

        listed = {e.name for e in load_config(config_file, environ={}).engines}
        for key in [k for k in env if k.startswith("LLMB__ENGINES__")]:
            if key.split("__")[2].lower() not in listed:
                del env[key]  # an override for an engine not listed
        with (tmp_path / "exporter.out").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "exporter", "--config", str(config_file)],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_http(f"http://127.0.0.1:{exporter_port}/metrics", 30, procs[1], "exporter")
        targets = {
            "llmb-exporter": [f"127.0.0.1:{exporter_port}"],
            "llmb-loadgen": [f"127.0.0.1:{get_free_port()}"],  # not running, as in compose
        }
        prom = start_prometheus(tmp_path, get_free_port(), targets)
        ready = "llmb:engine_bottleneck:verdict == 1" if listed else 'up{job="llmb-exporter"} == 1'
        prom.wait_until(lambda: bool(prom.query(ready)), 60, ready)
        time.sleep(20)  # 20 evaluations of every rule at the 1s interval
        alerts = {r["metric"]["alertname"] for r in prom.query("ALERTS")}
        verdicts = {
            r["metric"]["engine"]: r["metric"]["verdict"]
            for r in prom.query("llmb:engine_bottleneck:verdict == 1")
        }
        return alerts, verdicts
    finally:
        if prom is not None:
            stop_process(prom.process)
        for proc in procs:
            stop_process(proc)  # type: ignore[arg-type]


@pytest.mark.prometheus
@pytest.mark.timeout(300)
def test_plain_up_with_the_default_config_raises_no_alert(tmp_path: Path) -> None:
    """`docker compose up -d` without .env: the default config lists no engine, no alert."""
    default = re.fullmatch(
        r"\$\{LLMB_CONFIG_FILE:-(.+)\}:/etc/llmb/config.yaml:ro",
        raw()["services"]["exporter"]["volumes"][0],
    )
    assert default
    alerts, verdicts = profile_alerts(tmp_path, ROOT / default.group(1))
    assert alerts == set()
    assert verdicts == {}


@pytest.mark.prometheus
@pytest.mark.timeout(300)
def test_llamacpp_profile_raises_no_alert(tmp_path: Path) -> None:
    """The llamacpp profile with its config: ALERTS stays empty."""
    alerts, verdicts = profile_alerts(tmp_path, ROOT / "deploy" / "compose" / "llamacpp.yaml")
    assert alerts == set()
    assert verdicts == {"llama": "idle"}


@pytest.mark.prometheus
@pytest.mark.timeout(300)
def test_a_config_listing_an_engine_not_started_raises_engine_down(tmp_path: Path) -> None:
    """The check above can fail: the former default (both engines) alerts for `sgl`."""
    alerts, verdicts = profile_alerts(tmp_path, ROOT / "deploy" / "compose" / "both.yaml")
    assert "LLMEngineDown" in alerts
    assert verdicts == {"llama": "idle"}


def test_the_host_profile_lists_only_the_engines_whose_url_is_set() -> None:
    """gpu.yaml + .env's URLs: one engine per URL set, its log and model at the mounts."""
    from config.settings import load_config

    exporter = raw()["services"]["exporter"]
    mounts = {v.rsplit(":", 2)[1]: v.rsplit(":", 2)[0] for v in exporter["volumes"]}
    gpu = ROOT / "deploy" / "compose" / "gpu.yaml"
    env = {
        "LLAMACPP_URL": "http://127.0.0.1:8080",
        "LLAMACPP_LOG_FILE": "/srv/llama.log",
        "LLAMACPP_MODEL_FILE": "/srv/m.gguf",
    }
    (llama,) = load_config(gpu, environ=env).engines
    assert (llama.name, llama.kind, llama.url) == ("llama", "llamacpp", env["LLAMACPP_URL"])
    assert mounts[str(llama.log_file)] == "${LLAMACPP_LOG_FILE:-/dev/null}"
    assert mounts[str(llama.model_path)] == "${LLAMACPP_MODEL_FILE:-/dev/null}"
    # Without the optional paths the keys are left out, not set to an empty path.
    (bare,) = load_config(gpu, environ={"LLAMACPP_URL": env["LLAMACPP_URL"]}).engines
    assert bare.log_file is None and bare.model_path is None
    (sgl,) = load_config(gpu, environ={"SGLANG_URL": "http://127.0.0.1:30000"}).engines
    assert (sgl.name, sgl.kind, sgl.model_path) == ("sgl", "sglang", None)
    both = load_config(gpu, environ={**env, "SGLANG_URL": "http://127.0.0.1:30000"}).engines
    assert [e.name for e in both] == ["llama", "sgl"]
    for name in ("LLAMACPP_URL", "SGLANG_URL", "LLAMACPP_LOG_FILE", "LLAMACPP_MODEL_FILE"):
        assert exporter["environment"][name] == f"${{{name}:-}}", name
    services = raw()["services"]
    assert services["host-link"]["network_mode"] == "host"
    assert services["engine-link"]["network_mode"] == "service:exporter"
    for name in ("host-link", "engine-link"):
        assert services[name]["command"][-2:] == ["${LLAMACPP_URL:-}", "${SGLANG_URL:-}"], name
        assert "ports" not in services[name], name
