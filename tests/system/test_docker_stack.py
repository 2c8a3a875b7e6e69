"""System test: the project's docker-compose.yml on a real Docker daemon (issue 19).

Installs Debian's docker.io and docker-compose, starts dockerd when none runs (a daemon that
cannot start fails the test with its log), builds every image locally with no registry
(tests/docker_stack.py says what is substituted and why), then, on an `internal: true`
network, brings up in turn: plain `up -d`, the demo profile and the llamacpp profile with
the real CPU llama-server and Gemma 3 270M. Checks through the Prometheus and Alertmanager
APIs, read from inside the network; tears down with volumes and checks nothing is left.
The tests run in file order and share one stack.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.demo import KINDS, engine_name
from tests import docker_stack as ds
from tests.paths import ROOT
from tests.plugins.exporter import parse_samples
from tests.plugins.rotation import assert_rotations_hold, log_counters, rss_bytes

CORE = ["exporter", "prometheus", "alertmanager"]
LLAMA = [*CORE, "llamacpp", "llamacpp-logrotate"]
DEMO = ["demo", "prometheus", "alertmanager"]
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ds.Stack]:
    from tests.plugins.llama import find_gemma_model

    start = time.monotonic()
    base = ds.install_docker()
    TIMINGS["install"] = time.monotonic() - start
    work = tmp_path_factory.mktemp("docker-stack")
    # Bind mounts keep the source's mode: the exporter (uid 10001) must read the model.
    models = Path(os.path.realpath(work)) / "models"
    models.mkdir(mode=0o755)
    models.chmod(0o755)
    model = find_gemma_model()
    try:
        os.link(model, models / "model.gguf")  # the name deploy/compose/llamacpp.yaml reads
    except OSError:
        (models / "model.gguf").write_bytes(model.read_bytes())
    (models / "model.gguf").chmod(0o644)
    out = work / "out"
    env = ds.compose_env(models, out, base)
    TIMINGS.update(ds.build_images(base, env))
    s = ds.Stack(f"llmbtest{os.getpid()}", work, env, base)
    yield s
    try:
        s.down()
    finally:
        TIMINGS["total"] = time.monotonic() - start
        print(f"\ndocker stack timings (s): { {k: round(v) for k, v in TIMINGS.items()} }")


def documented_size(image_row: str) -> float:
    """MB given in docs/deploy.md's image table for the row naming `image_row`."""
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith(f"| `{image_row}`"))
    match = re.search(r"\| ([\d.]+) MB", row)
    assert match, row
    return float(match.group(1))


# The first test also waits for the fixture: install, debootstrap and every image build.
@pytest.mark.timeout(2400)
def test_the_documented_image_sizes_are_the_built_ones(stack: ds.Stack) -> None:
    """The pip layer of each project image, within 10 % of what docs/deploy.md says."""
    for image, row in zip(
        ds.PROJECT_IMAGES, ("llm-bottleneck-exporter", "llm-bottleneck"), strict=True
    ):
        measured = ds.pip_layer_bytes(image) / 1e6
        print(f"{image}: pip layer {measured:.1f} MB")
        assert abs(measured - documented_size(row)) <= 0.1 * measured, (image, measured)


def at_rest(stack: ds.Stack, engines: set[str]) -> None:
    """Targets up (the load generator's only while it runs), rules loaded, no alert."""
    targets = stack.api("http://127.0.0.1:9090/api/v1/targets")["data"]["activeTargets"]
    health = {t["labels"]["job"]: t["health"] for t in targets}
    assert health.get("llmb-exporter") == "up", targets
    groups = stack.api("http://127.0.0.1:9090/api/v1/rules")["data"]["groups"]
    shipped = sum(
        len(yaml.safe_load(p.read_text())["groups"])
        for p in (ROOT / "prometheus" / "rules").glob("*.yml")
    )
    assert len(groups) == shipped
    assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
    ds.wait_for(
        lambda: {r["metric"]["engine"] for r in stack.query("llmb:engine_bottleneck:verdict == 1")}
        == engines or None,
        120, f"a verdict for {engines}",
    )  # fmt: skip
    time.sleep(20)  # four evaluations of every rule at rest
    assert stack.query("ALERTS") == []
    assert stack.alertmanager_alerts() == []
    hosts = stack.query('count by (host) ({job="llmb-exporter", __name__=~"llmb_.+", host!=""})')
    assert [h["metric"]["host"] for h in hosts] == [ds.HOST_LABEL]


@pytest.mark.timeout(600)
def test_plain_up_starts_no_engine_and_raises_no_alert(stack: ds.Stack) -> None:
    """`docker compose up -d` with every default: the GPU-only config, nothing alerts."""
    start = time.monotonic()
    stack.compose([], "up", "-d", "--no-build")
    stack.wait_healthy(CORE)
    metrics = parse_samples(stack.fetch("http://exporter:9490/metrics"))
    assert metrics, "the exporter serves nothing"
    assert not [key for key in metrics if key[0] == "llmb_engine_up"]  # no engine listed
    targets = stack.api("http://127.0.0.1:9090/api/v1/targets")["data"]["activeTargets"]
    assert {t["labels"]["job"]: t["health"] for t in targets}["llmb-exporter"] == "up"
    time.sleep(20)
    assert stack.query("ALERTS") == [] and stack.alertmanager_alerts() == []
    TIMINGS["plain"] = time.monotonic() - start


@pytest.mark.timeout(600)
def test_demo_profile_gives_both_verdicts_at_rest(stack: ds.Stack) -> None:
    """The documented demo command, in place of the GPU exporter: verdicts, no alert."""
    start = time.monotonic()
    stack.compose(["demo"], "rm", "-sf", "exporter")
    stack.compose(["demo"], "up", "-d", "--no-build", *DEMO)
    stack.wait_healthy(DEMO)
    at_rest(stack, {engine_name(kind) for kind in KINDS})
    logs = ds.docker("logs", stack.container("demo"))
    assert "apt-get" not in logs and "127.0.0.1:9490" not in logs, logs
    assert "http://prometheus:9090" in logs, logs
    stack.compose(["demo"], "rm", "-sf", "demo")
    TIMINGS["demo"] = time.monotonic() - start


def llama_env(stack: ds.Stack) -> None:
    stack.env["LLMB_CONFIG_FILE"] = "./deploy/compose/llamacpp.yaml"


@pytest.mark.timeout(600)
def test_llamacpp_profile_is_healthy_with_verdict_and_geometry(stack: ds.Stack) -> None:
    start = time.monotonic()
    llama_env(stack)
    stack.compose(["llamacpp"], "up", "-d", "--no-build")
    stack.wait_healthy(LLAMA, timeout=300)
    for _ in range(2):
        complete(stack, 8)
    at_rest(stack, {"llama"})
    layers = stack.query('llmb_model_layers{engine="llama"}')
    assert [float(r["value"][1]) for r in layers] == [18.0]
    for name in ("llmb_model_kv_bytes_per_token_estimated", "llmb_model_kv_cache_bytes_estimated"):
        rows = stack.query(f'{name}{{engine="llama"}}')
        assert rows and float(rows[0]["value"][1]) > 0, name
    TIMINGS["llamacpp"] = time.monotonic() - start


def complete(stack: ds.Stack, tokens: int) -> None:
    """One completion, sent inside the llama-server container."""
    body = f'{{"prompt": "Say something", "n_predict": {tokens}, "cache_prompt": false}}'
    ds.docker(
        "exec", stack.container("llamacpp"), "curl", "-fsS", "-H", "Content-Type: application/json",
        "-d", body, "http://127.0.0.1:8080/completion",
    )  # fmt: skip


def rotate_once(stack: ds.Stack, rendered: dict[str, Any]) -> None:
    """The rotation the llamacpp-logrotate service does, run once in that container."""
    script = rendered["services"]["llamacpp-logrotate"]["command"][2].replace("$$", "$")
    rotation = next(line.strip() for line in script.splitlines() if '"$log.1"' in line)
    setup = next(line.strip() for line in script.splitlines() if line.strip().startswith("log="))
    ds.docker("exec", stack.container("llamacpp-logrotate"), "sh", "-c", f"{setup}; {rotation}")


@pytest.mark.timeout(600)
def test_log_rotation_keeps_rss_flat_and_counters_monotonic(stack: ds.Stack) -> None:
    rendered = ds.render(stack.env, stack.base, ["llamacpp"])
    pid = int(stack.inspect("exporter")["State"]["Pid"])

    def rotate_and_complete() -> None:
        rotate_once(stack, rendered)
        complete(stack, 8)

    assert_rotations_hold(
        rotate_and_complete,
        lambda: log_counters(parse_samples(stack.fetch("http://exporter:9490/metrics"))),
        lambda: rss_bytes(pid),
    )
    # Geometry from the load-time lines survives: the process is the same.
    assert stack.query('llmb_model_layers{engine="llama"}')
    assert stack.query("ALERTS") == []


@pytest.mark.timeout(600)
def test_loadgen_profile_writes_a_new_folder_per_run(stack: ds.Stack) -> None:
    """Two runs, two folders; while one runs, Prometheus has its target up."""
    load = "--engine llama --concurrency 1 --prompt-tokens 32 --max-tokens 8"
    stack.env["LOADGEN_ARGS"] = f"{load} --duration 25"
    stack.compose(["llamacpp", "loadgen"], "up", "-d", "--no-build", "loadgen")

    def loadgen_up() -> bool:
        targets = stack.api("http://127.0.0.1:9090/api/v1/targets")["data"]["activeTargets"]
        return all(t["health"] == "up" for t in targets) and len(targets) == 2

    ds.wait_for(loadgen_up, 60, "every target up (the load generator's too)", step=1)
    ds.wait_for(
        lambda: ds.docker("inspect", "-f", "{{.State.Status}}", stack.container("loadgen", True))
        .strip() == "exited",
        120, "the load run's end",
    )  # fmt: skip
    code = ds.docker("inspect", "-f", "{{.State.ExitCode}}", stack.container("loadgen", True))
    assert code.strip() == "0", ds.docker("logs", stack.container("loadgen", True))
    stack.env["LOADGEN_ARGS"] = f"{load} --requests 3"
    stack.compose(["llamacpp", "loadgen"], "run", "--rm", "loadgen", timeout=300)
    runs = sorted(p.name for p in Path(stack.env["LOADGEN_OUT_DIR"]).iterdir())
    assert len(runs) == 2 and all(r.startswith("run-") for r in runs), runs
    for name in runs:
        folder = Path(stack.env["LOADGEN_OUT_DIR"]) / name
        files = {p.name for p in folder.iterdir()}
        assert {"requests.jsonl", "summary.json", "summary.csv", "summary.md"} <= files, files
        assert folder.stat().st_uid == os.getuid()


@pytest.mark.timeout(600)
def test_stopping_llama_server_fires_engine_down_and_reaches_alertmanager(
    stack: ds.Stack,
) -> None:
    start = time.monotonic()
    stack.compose(["llamacpp"], "stop", "llamacpp")

    alert = stack.wait_for_alert("LLMEngineDown", "llama", 180)
    assert alert["labels"]["severity"] == "critical"
    TIMINGS["engine_down"] = time.monotonic() - start


def test_down_leaves_no_container_network_volume_or_process(stack: ds.Stack) -> None:
    stack.down()
    stack.down()  # idempotent; the fixture's own teardown runs it again
