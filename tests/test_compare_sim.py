"""compare/diagnose against the simulators, launched through real launch templates.

Each scenario preset pair must give the expected verdict: the simulators run the same
performance model for both engines, so only what the preset changes (slots, offload,
model size) may decide.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from exporter.config import EngineConfig, parse_config
from loadgen.__main__ import main as loadgen_main
from loadgen.compare import compare
from loadgen.decision import FIX_MEMORY, STAY, decide_single, roofline_fraction
from loadgen.diagnose import Diagnoser, Options, PhasePublisher
from loadgen.htmlreport import write_report
from loadgen.launcher import EngineProcess
from simulator import scenarios
from tests.conftest import get_free_port
from tests.test_htmlreport import assert_report_renders


def sim_engines(scenario: str, llama_ctx: bool = False) -> tuple[EngineConfig, EngineConfig]:
    """Both simulators of `scenario` with launch templates (slots as the preset sets them)."""
    sim = f"{sys.executable} -m simulator --scenario {scenario} --port {{port}}"
    cfg = parse_config(
        {
            "engines": [
                {
                    "name": "llama",
                    "kind": "llamacpp",
                    "url": f"http://127.0.0.1:{get_free_port()}",
                    "launch": {
                        "command": f"{sim} --kind llamacpp --log-file {{log}}"
                        + (" -c {ctx}" if llama_ctx else ""),
                        "ready_timeout_seconds": 60,
                        "settle_seconds": 0.2,
                    },
                },
                {
                    "name": "sglang",
                    "kind": "sglang",
                    "url": f"http://127.0.0.1:{get_free_port()}",
                    "launch": {
                        "command": f"{sim} --kind sglang",
                        "ready_timeout_seconds": 60,
                        "settle_seconds": 0.2,
                    },
                },
            ]
        },
        environ={},
    )
    return cfg.engines[0], cfg.engines[1]


def wait_http(url: str, timeout: float = 30.0) -> None:
    """Wait until `url` answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def opts(**kw: object) -> Options:
    base: dict[str, object] = {"concurrency": [1, 8], "prompt_tokens": [64], "max_tokens": 32}
    base.update(kw)
    return Options(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("scenario", "verdict", "in_recommendation"),
    [
        # Both engines 2 slots: equal everything; the tuning flag is more slots.
        ("scheduling_bound", STAY, "-np 8"),
        # Part of the layers on the GPU in the llama.cpp log (numbers from the preset).
        ("weights_not_resident", FIX_MEMORY, "only {ngl}/{total} layers on the GPU"),
    ],
)
def test_compare_scenarios(
    tmp_path: Path, scenario: str, verdict: str, in_recommendation: str
) -> None:
    results, decision = asyncio.run(compare(sim_engines(scenario), opts(), tmp_path))
    assert decision.verdict == verdict, decision.recommendation
    preset = scenarios.get(scenario)
    expected = in_recommendation.format(
        ngl=preset.params("llamacpp").n_gpu_layers, total=preset.model.n_layer + 1
    )
    assert expected in decision.recommendation
    a, b = results
    for e in results:
        assert [r.step for r in e.rows] == ["first", "single", "concurrency"]
        assert all(r.tokens_ok and r.completion_tokens == 32 * r.requests for r in e.rows)
        assert e.load_seconds is not None and e.load_seconds > 0
    # Byte-identical prompts: the same text on both engines (both simulators count words).
    assert a.rows[1].prompt_tokens is not None and b.rows[1].prompt_tokens is not None
    assert abs(a.rows[1].prompt_tokens - b.rows[1].prompt_tokens) <= 1
    # SGLang's /server_info names no dtype for the simulated model: the caveat says so.
    assert any("quantization unknown for sglang" in c for c in decision.caveats)


def test_decode_bound_roofline(tmp_path: Path) -> None:
    """32B Q8 on an L40S (864 GB/s): one sequence runs close to the bandwidth limit."""
    llama, _ = sim_engines("decode_bound")
    pub = PhasePublisher()
    o = opts(concurrency=[1, 4], bandwidth_bytes_per_s=864e9)
    result = asyncio.run(Diagnoser(llama, o, tmp_path, pub).run())
    frac = roofline_fraction(result)
    assert frac is not None and 0.6 < frac <= 1.05, frac
    d = decide_single(result)
    assert d.verdict == STAY
    assert f"the card is at {frac * 100:.0f} % of its decode limit" in d.recommendation


def test_diagnose_context_sweep_phases_and_metrics(tmp_path: Path) -> None:
    """Two contexts, two concurrencies: every phase, one restart with only -c changed."""
    llama, _ = sim_engines("healthy", llama_ctx=True)
    pub = PhasePublisher()
    o = opts(contexts=[2048, 8192], concurrency=[1, 2], settle=0.1)
    result = asyncio.run(Diagnoser(llama, o, tmp_path, pub).run())
    names = [p.name for p in result.phases]
    for phase in (
        "baseline",
        "start",
        "settle",
        "first_generation",
        "after",
        "weights",
        "single",
        "concurrency",
        "context",
    ):
        assert phase in names, names
    ctx_rows = [r for r in result.rows if r.step == "context"]
    assert [r.context for r in ctx_rows] == [2048, 8192]
    assert all(r.load_seconds and r.loaded_memory_bytes and not r.error for r in ctx_rows)
    launches = sorted(p.name for p in tmp_path.glob("llama-c*.stdout.log"))
    assert launches == ["llama-c2048-npdefault.stdout.log", "llama-c8192-npdefault.stdout.log"]
    assert result.layers_offloaded == result.layers_total == 33
    text = generate_latest(pub.registry).decode()
    assert 'llmb_loadgen_phase_info{engine="llama",phase="context"} 0.0' in text
    assert 'llmb_loadgen_phase_start_timestamp_seconds{engine="llama",phase="single"}' in text
    write_report(tmp_path / "report", [result], decide_single(result), title="diagnose llama")
    assert_report_renders(tmp_path / "report")
    doc = json.loads((tmp_path / "report" / "results.json").read_text())
    assert doc["verdict"] == STAY
    assert {r["step"] for r in doc["engines"][0]["rows"]} >= {"single", "concurrency", "context"}


def test_diagnose_with_exporter_gpu_numbers(tmp_path: Path) -> None:
    """Through the real exporter: GPU memory, process memory vs weights, roofline."""
    state = tmp_path / "gpu.json"
    exporter_port, sim_port = get_free_port(), get_free_port()
    sim = (
        f"{sys.executable} -m simulator --kind llamacpp --scenario healthy --port {{port}} "
        f"--gpu-state-file {state} --log-file {{log}}"
    )
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(
        json.dumps(
            {
                "listen": f"127.0.0.1:{exporter_port}",
                "engines": [
                    {
                        "name": "llama",
                        "kind": "llamacpp",
                        "url": f"http://127.0.0.1:{sim_port}",
                        "launch": {"command": sim, "settle_seconds": 0.5},
                    }
                ],
                "gpu": {"fake_file": str(state), "sample_interval_seconds": 0.1},
            }
        )
    )
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--config", str(cfg_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{exporter_port}/metrics")
        llama = parse_config(json.loads(cfg_file.read_text()), environ={}).engines[0]
        o = opts(concurrency=[1, 4], exporter_url=f"http://127.0.0.1:{exporter_port}")
        result = asyncio.run(Diagnoser(llama, o, tmp_path, PhasePublisher()).run())
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    preset = scenarios.get("healthy")
    assert result.memory_source == "gpu"
    assert result.bandwidth_bytes_per_s == pytest.approx(preset.gpu.bandwidth, rel=0.01)
    assert result.gpu_total_bytes == pytest.approx(preset.gpu.total_bytes, rel=0.01)
    assert result.weights_bytes and result.process_gpu_bytes
    assert result.process_gpu_bytes > result.weights_bytes  # weights + KV + buffers
    assert result.layers_offloaded == result.layers_total == preset.model.n_layer + 1
    loaded = next(p for p in result.phases if p.name == "settle").memory_bytes
    assert loaded is not None and loaded >= result.process_gpu_bytes * 0.99
    frac = roofline_fraction(result)
    assert frac is not None and 0 < frac < 1
    assert decide_single(result).verdict == STAY


def test_diagnose_running_server_without_launch_template(tmp_path: Path) -> None:
    """Only what a running server allows is measured; the report says what is missing."""
    port = get_free_port()
    argv = [sys.executable, "-m", "simulator", "--kind", "sglang", "--port", str(port)]
    with EngineProcess(argv, f"http://127.0.0.1:{port}/health", tmp_path / "sim.log"):
        engine = EngineConfig(name="sg", kind="sglang", url=f"http://127.0.0.1:{port}")
        result = asyncio.run(
            Diagnoser(engine, opts(contexts=[4096, 8192]), tmp_path, PhasePublisher()).run()
        )
    names = [p.name for p in result.phases]
    assert names == ["first_generation", "after", "weights", "single", "concurrency"]
    assert [r.step for r in result.rows] == ["first", "single", "concurrency"]
    assert all(r.tokens_ok for r in result.rows)
    assert result.slots == scenarios.get("healthy").params("sglang").n_slots
    joined = " | ".join(result.missing)
    for what in ("baseline memory", "load time", "context sweep", "loaded memory"):
        assert what in joined
    write_report(tmp_path / "r", [result], decide_single(result), title="diagnose sg")
    assert "context sweep (needs a launch template" in (tmp_path / "r" / "report.md").read_text()


def test_compare_cli_healthy_switch_batching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp preset 4 slots, SGLang 32: same per-token speed, more aggregate -> switch."""
    llama, sglang = sim_engines("healthy")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        json.dumps(
            {"engines": [e.model_dump(mode="json", exclude_none=True) for e in (llama, sglang)]}
        )
    )
    out = tmp_path / "out"
    code = loadgen_main(
        ["compare", "--config", str(cfg), "--engines", "llama,sglang", "--out", str(out),
         "--concurrency", "1,8", "--prompt-tokens", "64", "--max-tokens", "32",
         "--metrics-listen", f"127.0.0.1:{get_free_port()}"]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "verdict: switch: batching" in printed
    assert "caveat: quantization unknown for sglang" in printed
    doc = json.loads((out / "results.json").read_text())
    assert doc["verdict"] == "switch: batching" and doc["action"] == "switch"
    assert "batching/KV scheduling is the difference" in doc["recommendation"]
    step3 = doc["decision"]["steps"][2]
    assert step3["decisive"] and step3["numbers"]["concurrency"] == 8
    assert step3["numbers"]["ratio"] > 1.2
    assert_report_renders(out)


def test_unreachable_engine_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.yaml"
    url = f"http://127.0.0.1:{get_free_port()}"
    cfg.write_text(json.dumps({"engines": [{"name": "gone", "kind": "sglang", "url": url}]}))
    code = loadgen_main(
        ["diagnose", "--config", str(cfg), "--engine", "gone", "--out", str(tmp_path)]
    )
    assert code == 1
    assert f"gone: cannot reach {url}" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()
