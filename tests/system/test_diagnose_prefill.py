"""Prefill against the card's compute limit on the real CPU llama-server (Gemma 3 270M), and
prompts computed together at c=4: the time before the first token split from the engine's own
prompt time, and one prefill figure in the rules, diagnose and the report.

What is real: llama-server, its log's `prompt eval time` lines and `timings`, the model and
its tensor shapes, every request. The CPU has no datasheet peak, so the test measures
llama-server's own prompt speed once, sets `--peak-tflops` so that the truth is about 30 %,
and requires `diagnose` to find its prompt tok/s within 10 % of the server's own figures and
its efficiency within 15 % of the truth, never beyond physics. The FLOPs per token are
counted here independently, from the GGUF's tensor shapes (the `gguf` package's reader).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest

from core.prefill import busy_seconds
from tests.plugins.llama import LlamaServer
from tests.system.test_diagnose_llama import run, write_config

pytestmark = pytest.mark.llamaserver

PROMPT = 2048
TRUTH = 0.30
# llama.cpp's log: `prompt eval time =  X ms /  N tokens ( .. ms per token,  Y tokens per second)`
PROMPT_EVAL = re.compile(
    r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens .*?([\d.]+) tokens per second"
)


def flops_per_token(model: Path, prompt: float) -> float:
    """2 x the block matrices' parameters + attention at `prompt` tokens, by hand: Gemma 3
    attends with 4 heads of 256 (K and V) per layer; 5 of every 6 layers see 512 positions."""
    reader = gguf.GGUFReader(model)
    params = sum(
        int(t.n_elements) for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) > 1
    )
    layers = 1 + max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk."))
    per_position = 2 * 4 * (256 + 256)
    full = [i for i in range(layers) if (i + 1) % 6 == 0]
    m = min(prompt, 512)
    swa_positions = (m * (m + 1) / 2 + (prompt - m) * m) / prompt
    return (
        2 * params
        + per_position * len(full) * (prompt + 1) / 2
        + per_position * (layers - len(full)) * swa_positions
    )


def server_prompt_speed(server: LlamaServer) -> tuple[float, float]:
    """(prompt tokens, prompt tok/s) of one long prompt, as llama-server times it."""
    ids = [1000 + (i * 7919) % 200000 for i in range(PROMPT)]  # token ids: exactly PROMPT
    body = {"prompt": ids, "n_predict": 1, "cache_prompt": False}
    doc = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    assert "timings" in doc, doc
    timings = doc["timings"]
    return float(timings["prompt_n"]), float(timings["prompt_per_second"])


def test_prefill_efficiency_against_the_servers_own_prompt_timings(
    tmp_path: Path, llama_binary: Path, gemma_model: Path, llama_server: object
) -> None:
    server = llama_server(ctx=4096, parallel=1)  # type: ignore[operator]
    n, speed = server_prompt_speed(server)
    server.stop()
    peak = speed * flops_per_token(gemma_model, n) / TRUTH
    cfg = write_config(tmp_path, llama_binary, gemma_model, "")
    out = tmp_path / "out"
    doc = run(
        cfg, out, "--prompt-tokens", str(PROMPT), "--max-tokens", "8", "--concurrency", "1",
        "--contexts", "4096", "--kv-prompt-tokens", "0", "--peak-tflops", str(peak / 1e12),
    )  # fmt: skip
    engine = doc["engines"][0]
    prefill = engine["prefill"]
    single = next(r for r in engine["rows"] if r["step"] == "single")
    # The server's own figure for each long prompt of the run, from its log.
    logged = [
        float(m[3])
        for path in out.rglob("*.log")
        for m in PROMPT_EVAL.finditer(path.read_text(errors="replace"))
        if int(m[2]) >= PROMPT // 2
    ]
    assert len(logged) >= 2, "llama-server logged no long prompt"
    own = sum(logged) / len(logged)
    assert prefill["measured_tok_s"] == pytest.approx(own, rel=0.10)
    assert single["prefill_tok_s"] == prefill["measured_tok_s"]
    assert prefill["flops_per_token"] == pytest.approx(
        flops_per_token(gemma_model, prefill["prompt_tokens"]), rel=1e-6
    )
    truth = own * prefill["flops_per_token"] / peak
    assert prefill["efficiency"] == pytest.approx(truth, rel=0.15)
    assert prefill["efficiency"] <= 1.10 and not prefill["misfit"]
    assert prefill["limit_tok_s"] == pytest.approx(peak / prefill["flops_per_token"])
    # One request at a time: the time before the first token is the prompt, not waiting.
    assert single["queue_wait_s"] < 0.25 * single["prefill_s"]
    # Long prompts, most of each request computing them, below the limit: prefill, not decode.
    assert doc["verdict"] == {"llama": "prefill_below_card_limit"}


BATCH_PROMPT = 128


def _records(out: Path, steps: list[int]) -> list[dict[str, Any]]:
    """The requests.jsonl lines of the given step numbers that the engine timed."""
    lines = (out / "requests.jsonl").read_text().splitlines()
    docs = [json.loads(line) for line in lines if line.strip()]
    return [
        d for d in docs
        if d["step"] in steps and d["error"] is None and d["server_prompt_ms"] is not None
    ]  # fmt: skip


def _report_cells(out: Path, concurrency: int) -> dict[str, str]:
    """The report.md measurement row of the concurrency step at `concurrency`."""
    table = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in (out / "report.md").read_text().splitlines()
        if line.startswith("|")
    ]
    head = next(r for r in table if "prefill tok/s" in r)
    rows = [dict(zip(head, r, strict=True)) for r in table if len(r) == len(head)]
    return next(r for r in rows if r.get("step") == "concurrency" and r["conc"] == str(concurrency))


def test_prompts_computed_together_are_not_waiting_and_one_prefill_figure(
    tmp_path: Path, llama_binary: Path, gemma_model: Path
) -> None:
    """Four prompts sent at once to four slots: llama.cpp computes them in shared batches, so
    each request's own `prompt_ms` spans most of the batch. Waiting is TTFT minus that, per
    request (nothing waits the length of the batch's compute); the prefill figure is the prompt
    tokens over the union of the prompt spans, the same from the requests' timings (diagnose,
    the report) and from the exporter's series of the engine's log and counters (the rules)."""
    cfg = write_config(tmp_path, llama_binary, gemma_model, "")
    out = tmp_path / "out"
    doc = run(
        cfg, out, "--prompt-tokens", str(BATCH_PROMPT), "--max-tokens", "4",
        "--concurrency", "4", "--parallel", "4", "--requests-per-slot", "1",
        "--contexts", "4096", "--kv-prompt-tokens", "0", "--peak-tflops", "5",
    )  # fmt: skip
    engine = doc["engines"][0]
    row = next(r for r in engine["rows"] if r["step"] == "concurrency" and r["concurrency"] == 4)
    records = _records(out, row["record_steps"])
    assert len(records) == 4, records
    prompt_s = [r["server_prompt_ms"] / 1e3 for r in records]
    first = [r["start_time"] + r["ttft_s"] for r in records]
    spans = [(f - p, f) for f, p in zip(first, prompt_s, strict=True)]
    busy = busy_seconds(spans)
    # The prompts were computed together: their spans overlap (each request's prompt time
    # is most of the batch), so the sum of their prompt times is well above the union.
    assert sum(prompt_s) > 2.0 * busy, (prompt_s, busy)
    # The split: computing is each request's own prompt time, waiting the rest of its TTFT.
    waits = [max(r["ttft_s"] - p, 0.0) for r, p in zip(records, prompt_s, strict=True)]
    assert row["prefill_s"] == pytest.approx(sum(prompt_s) / 4, rel=1e-6)
    assert row["queue_wait_s"] == pytest.approx(sum(waits) / 4, rel=1e-6, abs=1e-6)
    assert row["ttft_split_source"] == "requests"
    # TTFT = waiting + computing. A prompt computed in a shared batch computes for the whole of
    # it; only the time before its slot took it up (TTFT beyond its prompt time) is waiting.
    ttft = sum(r["ttft_s"] for r in records) / 4
    assert row["queue_wait_s"] + row["prefill_s"] == pytest.approx(ttft, rel=0.01)
    assert row["queue_wait_s"] < ttft - busy / 4, (
        "a share of the batch's compute counted as waiting"
    )
    # One prefill figure: prompt tokens computed over the union of the prompt spans ...
    tokens = sum(r["server_prompt_n"] for r in records)
    assert row["prefill_tok_s"] == pytest.approx(tokens / busy, rel=1e-6)
    # ... the rules' over the step's window from the exporter's series (llama.cpp's
    # `prompt_tokens_total` over the union of the log's `prompt eval time` spans) ...
    assert row["rules_prefill_tok_s"] == pytest.approx(row["prefill_tok_s"], rel=0.10)
    flops = flops_per_token(gemma_model, row["prompt_tokens"])
    assert row["prefill_efficiency"] == pytest.approx(row["prefill_tok_s"] * flops / 5e12, rel=1e-6)
    # ... and the report's, the same numbers.
    cells = _report_cells(out, 4)
    assert float(cells["prefill tok/s"]) == pytest.approx(row["prefill_tok_s"], abs=0.5)
    assert cells["of compute limit"] == f"{row['prefill_efficiency'] * 100:.0f} %"
