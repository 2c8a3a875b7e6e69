"""The whole stack natively: simulators -> exporter -> Prometheus with the shipped rules.

One simulator per (engine kind, scenario preset), each a separate process so that its GPU
process is attributed to it; the real exporter reads them and the simulators' NVML-shaped
state files; the real load generator drives each loaded engine; a real Prometheus scrapes
the exporter and the load generators with `prometheus/prometheus.yml`'s jobs and the
shipped rule files. The tests then check the verdict per scenario and engine, the KV alert,
and that every Grafana panel query returns data.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from core.conditions import VERDICTS
from simulator.demo import DEFAULT_LOAD, Load
from simulator.demo import LOADS as DEMO_LOADS
from tests.conftest import get_free_port
from tests.plugins.cli import wait_http
from tests.plugins.prom import ROOT, PrometheusServer, start_prometheus, stop_process

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(600)]

KINDS = ("llamacpp", "sglang")
# Twelve simulators, ten load generators, the exporter and Prometheus share a 2-core CI
# machine: the simulators run at a quarter of real speed (wall seconds per simulated
# second) and Prometheus keeps the shipped 5s scrape and evaluation interval. The verdict
# does not depend on either: per-sequence decode is a ratio of two counters in simulated
# time, and a 1m window still holds 12 samples.
TIME_SCALE = "4"


# Loads that put each preset into its bottleneck: the demo's table (one source), with the
# default load on the healthy preset and none on the idle engine.
LOADS: dict[str, dict[str, Load | None]] = {
    "healthy": dict.fromkeys(KINDS, DEFAULT_LOAD),
    **{name: dict(loads) for name, loads in DEMO_LOADS.items()},
    "idle": dict.fromkeys(KINDS, None),
}
EXPECTED = {
    "healthy": "decode_at_card_limit",
    "weights_not_resident": "weights_not_resident",
    "kv_saturated": "kv_saturated",
    "scheduling_bound": "scheduling_bound",
    "decode_at_card_limit": "decode_at_card_limit",
    "idle": "idle",
}
# Scenario preset each engine runs ("idle" is the healthy preset with no load).
PRESET = {name: ("healthy" if name == "idle" else name) for name in LOADS}
# HF config.json shapes of the presets' models (simulator/scenarios.py: MID_8B, BIG_32B),
# given to the exporter as SGLang `model_path` so it can estimate KV bytes per token.
HF_CONFIGS = {
    "8b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32},
    "32b": {"num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 40},
}


def write_model_dirs(workdir: Path, shapes: dict[str, dict[str, int]]) -> dict[str, Path]:
    """One HF model folder (config.json only) per preset model shape, for SGLang `model_path`."""
    dirs = {}
    for size, shape in shapes.items():
        folder = workdir / f"model-{size}"
        folder.mkdir()
        config_json = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
            **shape,
        }
        (folder / "config.json").write_text(json.dumps(config_json))
        dirs[size] = folder
    return dirs


def engine_name(kind: str, scenario: str) -> str:
    return f"{kind}-{scenario}"


@dataclass
class Stack:
    """Everything the module started."""

    workdir: Path
    prometheus: PrometheusServer | None = None
    exporter_url: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    expected: dict[str, str] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start a child process with its output in WORKDIR/NAME.log."""
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return proc

    def logs(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def verdicts(prom: PrometheusServer) -> dict[str, str]:
    """Active verdict per engine."""
    rows = prom.query("llmb:engine_bottleneck:verdict == 1")
    return {r["metric"]["engine"]: r["metric"]["verdict"] for r in rows}


def firing(prom: PrometheusServer, alertname: str) -> set[str]:
    """Engines for which `alertname` is firing."""
    alerts = prom.get("/api/v1/alerts")["alerts"]
    return {
        a["labels"].get("engine", "")
        for a in alerts
        if a["labels"]["alertname"] == alertname and a["state"] == "firing"
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Start simulators, exporter, load generators and Prometheus; stop them afterwards."""
    st = Stack(tmp_path_factory.mktemp("stack"))
    try:
        model_dirs = write_model_dirs(st.workdir, HF_CONFIGS)
        engines = []
        state_files = []
        for scenario in LOADS:
            for kind in KINDS:
                name = engine_name(kind, scenario)
                port = get_free_port()
                state = st.workdir / f"{name}.nvml.json"
                argv = [sys.executable, "-m", "simulator", "--kind", kind, "--port", str(port)]
                argv += ["--scenario", PRESET[scenario], "--gpu-state-file", str(state)]
                argv += ["--time-scale", TIME_SCALE]
                engine: dict[str, object] = {
                    "name": name,
                    "kind": kind,
                    "url": f"http://127.0.0.1:{port}",
                }
                if kind == "llamacpp":
                    log = st.workdir / f"{name}.llama-server.log"
                    argv += ["--log-file", str(log)]
                    engine["log_file"] = str(log)
                else:
                    engine["model_path"] = str(
                        model_dirs["32b" if scenario == "decode_at_card_limit" else "8b"]
                    )
                proc = st.spawn(name, argv)
                engines.append((engine, proc))
                state_files.append(str(state))
                st.expected[name] = EXPECTED[scenario]
        for engine, proc in engines:
            wait_http(f"{engine['url']}/health", 30, proc, str(engine["name"]))

        exporter_port = get_free_port()
        config = {
            "listen": f"127.0.0.1:{exporter_port}",
            "engines": [e for e, _ in engines],
            "gpu": {"fake_file": state_files, "sample_interval_seconds": 0.2},
        }
        config_path = st.workdir / "llmb.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        exporter = st.spawn(
            "exporter", [sys.executable, "-m", "exporter", "--config", str(config_path)]
        )
        st.exporter_url = f"http://127.0.0.1:{exporter_port}"
        wait_http(f"{st.exporter_url}/metrics", 30, exporter, "exporter")

        loadgen_targets = []
        for scenario, per_kind in LOADS.items():
            for kind, load in per_kind.items():
                if load is None:
                    continue
                name = engine_name(kind, scenario)
                metrics_port = get_free_port()
                argv = [sys.executable, "-m", "cli.loadgen", "run", "--config", str(config_path)]
                argv += ["--engine", name, "--concurrency", str(load.concurrency)]
                argv += ["--prompt-tokens", str(load.prompt_tokens)]
                argv += ["--max-tokens", str(load.max_tokens), "--duration", "900"]
                argv += ["--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"]
                argv += ["--out", str(st.workdir / f"run-{name}"), "--no-progress"]
                argv += ["--slo", "e2e_p99=60s"]  # the Load-run dashboard's goodput panel
                st.spawn(f"loadgen-{name}", argv)
                loadgen_targets.append(f"127.0.0.1:{metrics_port}")

        prom_dir = st.workdir / "prometheus"
        prom_dir.mkdir()
        st.prometheus = start_prometheus(
            prom_dir,
            get_free_port(),
            {"llmb-exporter": [f"127.0.0.1:{exporter_port}"], "llmb-loadgen": loadgen_targets},
            interval=None,
        )
        yield st
    finally:
        if st.prometheus is not None:
            stop_process(st.prometheus.process)
        # Load generators first (they write their summaries), then exporter and simulators.
        for proc in reversed(st.processes):
            stop_process(proc)


# SGLang offloads weights to the CPU with --cpu-offload-gb; the verdict then rests on
# llmb_model_weights_bytes counting the offloaded part too. Checked in its own test below.
SGLANG_OFFLOAD = engine_name("sglang", "weights_not_resident")


@pytest.fixture(scope="module")
def settled(stack: Stack) -> Stack:
    """Wait (bounded) until every engine but SGLANG_OFFLOAD shows its expected verdict."""
    prom = stack.prometheus
    assert prom is not None
    expected = {k: v for k, v in stack.expected.items() if k != SGLANG_OFFLOAD}
    deadline = time.monotonic() + 300
    last: dict[str, str] = {}
    while time.monotonic() < deadline:
        last = verdicts(prom)
        if {k: v for k, v in last.items() if k != SGLANG_OFFLOAD} == expected:
            return stack
        time.sleep(2)
    summary = json.dumps({"expected": stack.expected, "got": last}, indent=1, sort_keys=True)
    raise AssertionError(f"verdicts did not settle:\n{summary}\n{prom.log_tail()}")


def test_prometheus_scrapes_the_exporter_and_every_load_generator(stack: Stack) -> None:
    prom = stack.prometheus
    assert prom is not None

    def all_up() -> bool:
        targets = prom.get("/api/v1/targets")["activeTargets"]
        return len(targets) == 11 and all(t["health"] == "up" for t in targets)

    prom.wait_until(all_up, 60, "every scrape target up")
    jobs = {t["labels"]["job"] for t in prom.get("/api/v1/targets")["activeTargets"]}
    assert jobs == {"llmb-exporter", "llmb-loadgen"}


def test_verdict_per_scenario_and_engine(settled: Stack) -> None:
    prom = settled.prometheus
    assert prom is not None
    got = verdicts(prom)
    assert set(got) == set(settled.expected)
    assert {k: v for k, v in got.items() if k != SGLANG_OFFLOAD} == {
        k: v for k, v in settled.expected.items() if k != SGLANG_OFFLOAD
    }
    # exactly one active verdict per engine, one series per verdict present
    for row in prom.query("count by (engine) (llmb:engine_bottleneck:verdict)"):
        assert float(row["value"][1]) == len(VERDICTS), row
    for row in prom.query("sum by (engine) (llmb:engine_bottleneck:verdict)"):
        assert float(row["value"][1]) == 1, row


def test_sglang_with_weights_offloaded_to_the_cpu_is_weights_not_resident(
    settled: Stack,
) -> None:
    prom = settled.prometheus
    assert prom is not None
    prom.wait_until(
        lambda: verdicts(prom).get(SGLANG_OFFLOAD) == "weights_not_resident",
        30,
        f"{SGLANG_OFFLOAD} to be judged weights_not_resident "
        f"(got {verdicts(prom).get(SGLANG_OFFLOAD)})",
    )


def test_kv_alert_fires_for_kv_saturated_and_not_for_scheduling_bound(settled: Stack) -> None:
    prom = settled.prometheus
    assert prom is not None
    kv = {engine_name(k, "kv_saturated") for k in KINDS}
    sched = {engine_name(k, "scheduling_bound") for k in KINDS}
    prom.wait_until(
        lambda: kv <= firing(prom, "LLMKVCacheSaturated"), 150, "LLMKVCacheSaturated to fire"
    )
    assert firing(prom, "LLMKVCacheSaturated") == kv
    assert not firing(prom, "LLMKVCacheSaturated") & sched
    assert not firing(prom, "LLMKVCacheSaturated") & {
        engine_name(k, s) for k in KINDS for s in LOADS if s != "kv_saturated"
    }


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) for every panel target of every shipped dashboard."""
    out = []
    for path in sorted((ROOT / "grafana" / "dashboards").glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
        for ann in doc["annotations"]["list"]:
            out.append((path.name, f"annotation {ann['name']}", ann["expr"]))
    return out


def test_every_dashboard_panel_query_returns_data(settled: Stack) -> None:
    prom = settled.prometheus
    assert prom is not None
    queries = dashboard_queries()
    assert len(queries) > 40
    empty = []
    for dashboard, panel, expr in queries:
        # Grafana's "All" for the host and engine variables.
        concrete = expr.replace("$host", ".*").replace("$engine", ".*")
        if not prom.query(concrete):
            empty.append(f"{dashboard} / {panel}: {expr}")
    assert empty == []
