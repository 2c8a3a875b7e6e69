"""`diagnose` against the engine simulators (integration: real processes, real HTTP).

Each preset induces one bottleneck; diagnose must name it with the decision core's
vocabulary. The simulators write an NVML-shaped GPU file that the exporter's own NVML
collector reads (inside diagnose, or in a real exporter process), so residency, memory and
bandwidth come through the same code as on a GPU host. One test runs a real Prometheus with
the shipped rules beside diagnose and requires the same verdict.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main as loadgen_main
from config.settings import EngineConfig, GpuConfig, parse_config
from core.conditions import evaluate
from core.signals import Signals
from core.thresholds import threshold_number
from diagnose.decision.model import FIX_MEMORY_FIRST, STAY_AND_TUNE
from diagnose.decision.one_engine import recommendation_for
from diagnose.launcher import EngineProcess
from diagnose.options import Options
from diagnose.procedure import diagnose
from model.host_memory import HostBandwidth
from tests.conftest import get_free_port
from tests.plugins.prom import PrometheusServer


def sim_engine(
    tmp_path: Path, scenario: str, kind: str, name: str = "e", flags: str = ""
) -> tuple[EngineConfig, GpuConfig]:
    """A simulator with a launch template (its llama.cpp log and GPU file included)."""
    state = tmp_path / "gpu.json"
    log = " --log-file {log}" if kind == "llamacpp" else ""
    command = (
        f"{sys.executable} -m simulator --scenario {scenario} --kind {kind} --port {{port}} "
        f"--gpu-state-file {state}{log} {flags}"
    )
    cfg = parse_config(
        {
            "engines": [
                {
                    "name": name,
                    "kind": kind,
                    "url": f"http://127.0.0.1:{get_free_port()}",
                    "launch": {"command": command, "ready_timeout_seconds": 60,
                               "settle_seconds": 0.5},
                }
            ],
            "gpu": {"fake_file": str(state), "sample_interval_seconds": 0.1},
        },
        environ={},
    )  # fmt: skip
    return cfg.engines[0], cfg.gpu


def options(gpu: GpuConfig, **kw: Any) -> Options:
    base: dict[str, Any] = {
        "concurrency": [1, 4],
        "prompt_tokens": 64,
        "max_tokens": 32,
        "contexts": [],
        "gpu": gpu,
    }
    base.update(kw)
    return Options(**base)


@pytest.mark.parametrize(
    ("kind", "scenario", "expected", "decisive"),
    [
        ("llamacpp", "weights_not_resident", "weights_not_resident", "residency"),
        ("llamacpp", "kv_saturated", "kv_saturated", "kv_pressure"),
        ("llamacpp", "scheduling_bound", "scheduling_bound", "concurrency"),
        # 32B Q8 on an L40S: one sequence reads 35 GB per token at 864 GB/s.
        ("llamacpp", "decode_at_card_limit", "decode_at_card_limit", None),
        ("sglang", "weights_not_resident", "weights_not_resident", "residency"),
        ("sglang", "kv_saturated", "kv_saturated", "kv_pressure"),
        ("sglang", "scheduling_bound", "scheduling_bound", "concurrency"),
        # The seed's case: bf16 weights (51 GiB) on a 72 GB card at 1.344e12 B/s.
        ("sglang", "rtx-pro-5000-27b", "decode_at_card_limit", None),
        # Issue 27: an H100 held at its power limit (NVML: SW power cap, SM 1155/1980 MHz).
        ("llamacpp", "card_throttled", "card_throttled", None),
        ("sglang", "card_throttled", "card_throttled", None),
    ],
)
def test_diagnose_names_the_preset_bottleneck(
    tmp_path: Path, kind: str, scenario: str, expected: str, decisive: str | None
) -> None:
    engine, gpu = sim_engine(tmp_path, scenario, kind)
    # Two slots: 8 clients of 64 tokens keep requests waiting over several 0.5 s samples
    # (4 clients of 32 tokens finish within about two, too few on a busy machine).
    extra: dict[str, Any] = {"concurrency": [1, 8], "max_tokens": 64}
    # The KV wave's automatic prompt is half a slot's context (up to 16k tokens). With most
    # layers on the host the simulator prefills about 60 tok/s, so 4 of them take 5 minutes.
    # Only the kv_saturated preset needs that length; the others take a short wave.
    short_kv = {} if scenario == "kv_saturated" else {"kv_prompt_tokens": 128}
    opts = options(gpu, **(extra if scenario == "scheduling_bound" else {}), **short_kv)
    result, decision = asyncio.run(diagnose(engine, opts, tmp_path / "out"))
    assert decision.verdict == {"e": expected}, [s.answer for s in decision.steps]
    assert result.verdict == expected
    # The verdict is the decision core's answer to the signals diagnose recorded.
    assert evaluate(Signals(**result.signals)).name == expected
    # The action of the evidence that held (e.g. the running cap), else the verdict's.
    assert decision.action == evaluate(Signals(**result.signals)).action
    assert decision.recommendation == recommendation_for(expected)
    steps = {s.key: s for s in decision.steps}
    assert list(steps) == ["residency", "single", "concurrency", "kv_pressure", "context"]
    if decisive is not None:
        assert steps[decisive].decisive, steps[decisive].answer
    assert steps["context"].answer == "not measured: the launch template has no {ctx} placeholder"
    assert result.memory_source == "gpu" and result.bandwidth_bytes_per_s
    # Identity for the report's metadata block, from the exporter's info series.
    assert result.gpu_driver == "580.159.04" and result.engine_version
    if expected == "card_throttled":
        assert result.signals["card_power_slowdown"] >= threshold_number("card_slowdown_share_min")
        assert "power limit" in decision.action and "engine is not the cause" in decision.action
        # What the card did, beside the verdict (core.card.card_sentence): 1155 of 1980 MHz
        # at its stock 700 W limit explains the shortfall.
        assert result.evidence["card"].startswith(
            "The card ran at 58 % of its maximum SM clock under load at its stock 700 W"
        )
        assert "the card is the cause." in result.evidence["card"]
    if expected == "decode_at_card_limit":
        assert result.signals["decode_efficiency"] >= threshold_number("decode_efficiency_at_limit")
        assert "of the card's limit" in steps["single"].answer


def test_weights_not_resident_recommends_fixing_memory(tmp_path: Path) -> None:
    engine, gpu = sim_engine(tmp_path, "weights_not_resident", "llamacpp")
    _, decision = asyncio.run(
        diagnose(engine, options(gpu, concurrency=[1], kv_prompt_tokens=0), tmp_path / "o")
    )
    assert decision.recommendation == FIX_MEMORY_FIRST
    residency = decision.steps[0]
    assert residency.answer.startswith("no: layers")
    assert residency.numbers["layers_ratio"] == pytest.approx(10 / 33)
    assert decision.steps[2].answer == "not measured: no --concurrency above 1"
    assert decision.steps[3].answer == "not measured: skipped (--kv-prompt-tokens 0)"


def test_context_sweep_restarts_until_the_trained_context(tmp_path: Path) -> None:
    """Automatic sweep: doubling from the launch context up to --max-context."""
    engine, gpu = sim_engine(tmp_path, "healthy", "llamacpp", flags="-c {ctx} -np {parallel}")
    opts = options(gpu, contexts=None, max_context=65536, concurrency=[1], kv_prompt_tokens=0)
    result, decision = asyncio.run(diagnose(engine, opts, tmp_path / "o"))
    ctx_rows = [r for r in result.rows if r.step == "context"]
    assert [r.context for r in ctx_rows] == [8192, 16384, 32768, 65536]
    assert all(r.error is None and r.load_seconds and r.kv_bytes for r in ctx_rows)
    # A longer context allocates more KV (the exporter's estimate / the engine's log).
    kv = [r.kv_bytes or 0 for r in ctx_rows]
    assert kv == sorted(kv) and kv[0] < kv[-1]
    assert decision.steps[4].answer == "every context loaded up to 65536"
    logs = sorted(p.name for p in (tmp_path / "o").glob("e-c*-np1.log"))
    assert logs == [f"e-c{c}-np1.log" for c in ("16384", "32768", "65536", "8192", "default")]


def test_cli_against_a_running_server_with_url_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No config, no launch template: the relaunch steps say so; the answer is printed once."""
    port = get_free_port()
    argv = [sys.executable, "-m", "simulator", "--kind", "llamacpp", "--scenario",
            "scheduling_bound", "--port", str(port)]  # fmt: skip
    out = tmp_path / "out"
    with EngineProcess(argv, f"http://127.0.0.1:{port}/health", tmp_path / "sim.log"):
        code = loadgen_main(
            ["diagnose", "--url", f"http://127.0.0.1:{port}", "--out", str(out),
             "--concurrency", "1,8", "--prompt-tokens", "64", "--max-tokens", "64",
             "--kv-prompt-tokens", "0"]
        )  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    printed, progress = captured.out, captured.err
    # The answer: verdict first, then recommendation and action; said once.
    lines = printed.splitlines()
    assert re.match(r"verdict +llmb-sim-8b-q4_k_m: scheduling_bound$", lines[0]), lines[0]
    assert lines[1].split() == ["recommendation", STAY_AND_TUNE]
    assert lines[2].startswith("action") and "-np" in lines[2]
    assert printed.count("scheduling_bound") == 1
    # One progress line per step on stderr.
    for step in ("residency", "single", "concurrency", "kv_pressure", "context"):
        assert f"] {step}: " in progress, step
    assert "context: not measured: the engine was already running" in progress
    assert "prompt calibrated" not in progress and "HTTP Request" not in progress
    # The host's memory bandwidth, measured once before the run (the expert-offload bound).
    assert re.search(r"host memory bandwidth: [\d.]+ GB/s, measured", progress), progress
    doc = json.loads((out / "results.json").read_text())
    assert doc["engines"][0]["host_bandwidth_source"] == "measured"
    assert doc["engines"][0]["host_bandwidth_bytes_per_s"] > 1e8
    assert doc["verdict"] == {"llmb-sim-8b-q4_k_m": "scheduling_bound"}
    assert doc["recommendation"] == STAY_AND_TUNE and doc["comparable"] is True
    assert doc["tool_version"] and doc["command"].startswith("llmb-loadgen diagnose --url")
    for key in ("started_at", "finished_at"):
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", doc[key]), doc[key]
    assert isinstance(doc["caveats"], list)
    md = (out / "report.md").read_text()
    assert "scheduling_bound" in md


def _wait(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.2)


@pytest.mark.prometheus
@pytest.mark.parametrize("scenario", ["kv_saturated", "weights_not_resident"])
def test_verdict_equals_the_prometheus_rule_on_the_same_run(
    tmp_path: Path,
    scenario: str,
    prometheus_server: Callable[[dict[str, list[str]]], PrometheusServer],
) -> None:
    """A running engine, a real exporter and Prometheus (shipped rules) watch diagnose's run.

    The engine keeps running after diagnose, so the rules' verdict at the end covers the
    whole run (their windows are 1m and 5m) and can be read while the engine is up.
    """
    port, exporter_port = get_free_port(), get_free_port()
    state, log = tmp_path / "gpu.json", tmp_path / "engine.log"
    argv = [sys.executable, "-m", "simulator", "--scenario", scenario, "--kind", "llamacpp",
            "--port", str(port), "--gpu-state-file", str(state),
            "--log-file", str(log)]  # fmt: skip
    cfg = tmp_path / "exporter.json"
    cfg.write_text(json.dumps({
        "listen": f"127.0.0.1:{exporter_port}",
        # Answer within Prometheus' 1 s scrape timeout even while the simulator is busy.
        "scrape_timeout_seconds": 0.8, "source_timeout_seconds": 0.7,
        "engines": [{"name": "e", "kind": "llamacpp", "url": f"http://127.0.0.1:{port}",
                     "log_file": str(log)}],
        "gpu": {"fake_file": str(state), "sample_interval_seconds": 0.1},
    }))  # fmt: skip
    engine = EngineConfig(name="e", kind="llamacpp", url=f"http://127.0.0.1:{port}", log_file=log)
    with EngineProcess(argv, f"http://127.0.0.1:{port}/health", tmp_path / "sim.out"):
        exporter = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            prom = prometheus_server({"llmb-exporter": [f"127.0.0.1:{exporter_port}"]})
            _wait(lambda: bool(prom.query('llmb:engine_bottleneck:verdict{engine="e"}')))
            # A short KV wave where the verdict is not the KV cache's (see above).
            kv = None if scenario == "kv_saturated" else 128
            opts = Options(concurrency=[1, 4], prompt_tokens=64, max_tokens=32,
                           kv_prompt_tokens=kv,
                           exporter_url=f"http://127.0.0.1:{exporter_port}/metrics")  # fmt: skip
            _, decision = asyncio.run(diagnose(engine, opts, tmp_path / "out"))
            # Let Prometheus scrape the last samples and evaluate the rules again.
            time.sleep(3)
            now = prom.query('llmb:engine_bottleneck:verdict{engine="e"} == 1')
        finally:
            exporter.terminate()
            exporter.wait(timeout=30)
    assert [v["metric"]["verdict"] for v in now] == [scenario]
    assert decision.verdict == {"e": scenario}


@pytest.mark.parametrize("kind", ["llamacpp", "sglang"])  # each preset on both engines
@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        # Qwen3-30B-A3B shapes on an H200. All weights (32.5 GB) against 4.8 TB/s would make
        # llama.cpp's 238 tok/s 161 % of the card; against the 3.27 GB it reads it is 16 %.
        ("moe_below_limit", "decode_below_card_limit"),
        ("moe_at_limit", "decode_at_card_limit"),
        # About 3 tokens per target step: per weight read the card is at its limit.
        ("spec_decode", "decode_at_card_limit"),
        # 20 of 48 layers' experts in host memory (llama.cpp --n-cpu-moe 20), layers (SGLang).
        ("moe_experts_on_host", "weights_not_resident"),
        # 8-bit KV caches: the estimate follows the engine's element type.
        ("kv_quantized", "decode_at_card_limit"),
    ],
)
def test_diagnose_roofline_of_moe_spec_and_kv_presets(
    tmp_path: Path, kind: str, scenario: str, expected: str
) -> None:
    engine, gpu = sim_engine(tmp_path, scenario, kind)
    # At the limit an MoE model's bytes per step depend on the batch; one sequence (decoding
    # long enough for the rules' windows) keeps their batch and the measured speed together.
    at_limit_moe = scenario == "moe_at_limit"
    extra: dict[str, Any] = {"concurrency": [1], "max_tokens": 256} if at_limit_moe else {}
    if scenario == "moe_experts_on_host":
        # The simulator's host memory (its CPU reads the host experts at 55 GB/s), given as
        # --host-bandwidth-gbs would: the embedded exporter exports it, the bound divides it.
        extra["host_bandwidth"] = HostBandwidth(55e9, "flag")
    opts = options(gpu, **{"concurrency": [1, 4], "kv_prompt_tokens": 0, **extra})
    result, decision = asyncio.run(diagnose(engine, opts, tmp_path / "out"))
    assert decision.verdict == {"e": expected}, [s.answer for s in decision.steps]
    if expected == "weights_not_resident":
        if kind == "llamacpp":  # the action names the layers and bytes in host memory
            assert "20" in decision.action and "--n-cpu-moe" in decision.action, decision.action
            assert (result.host_bandwidth_bytes_per_s, result.host_bandwidth_source) == (
                55e9,
                "flag",
            )
            bound = result.host_offload().bound
            assert bound is not None
            want = f"bound near {bound:.1f} tok/s per sequence by host memory (55.0 GB/s, flag"
            assert want in decision.action, decision.action
            assert "-ngl" not in decision.action
        return
    # Never beyond physics, and the bytes per step are those of the preset's model.
    efficiency = result.signals["decode_efficiency"]
    assert efficiency is not None and efficiency <= threshold_number(
        "decode_efficiency_physical_max"
    )
    roof = result.roofline
    assert roof is not None and roof.misfit is None
    assert roof.efficiency is not None and roof.efficiency < 1.0
    if scenario.startswith("moe"):
        # Batch 1 reads k/E of the experts: within 10 % of the model's active bytes.
        active = 3.27e9 if kind == "llamacpp" else 6.08e9
        assert roof.active_weights_bytes == pytest.approx(active, rel=0.10)
    if scenario == "spec_decode":
        assert roof.accepted_tokens_per_step == pytest.approx(3.05, rel=0.2)
