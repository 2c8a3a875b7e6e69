"""compare/diagnose against the simulators, launched through real launch templates.

Each scenario preset pair must give the expected verdict: the simulators run the same
performance model for both engines, so only what the preset changes (slots, offload,
model size) may decide.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from exporter.config import EngineConfig, parse_config
from loadgen.compare import compare
from loadgen.decision import FIX_MEMORY, STAY, decide_single, roofline_fraction
from loadgen.diagnose import Diagnoser, Options, PhasePublisher
from loadgen.htmlreport import write_report
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


def opts(**kw: object) -> Options:
    base: dict[str, object] = {"concurrency": [1, 8], "prompt_tokens": [64], "max_tokens": 32}
    base.update(kw)
    return Options(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("scenario", "verdict", "in_recommendation"),
    [
        # llama.cpp preset 4 slots, SGLang 32: same per-token speed, more aggregate.
        ("healthy", "switch: batching", "batching/KV scheduling is the difference"),
        # Both engines 2 slots: equal everything; the tuning flag is more slots.
        ("scheduling_bound", STAY, "-np 8"),
        # Only 16 of 33 layers on the GPU in the llama.cpp log.
        ("weights_not_resident", FIX_MEMORY, "only 16/33 layers on the GPU"),
    ],
)
def test_compare_scenarios(
    tmp_path: Path, scenario: str, verdict: str, in_recommendation: str
) -> None:
    results, decision = asyncio.run(compare(sim_engines(scenario), opts(), tmp_path))
    assert decision.verdict == verdict, decision.recommendation
    assert in_recommendation in decision.recommendation
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
