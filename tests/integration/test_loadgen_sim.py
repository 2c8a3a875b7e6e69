"""The load generator against both engine simulators (llama.cpp and SGLang shapes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadgen.scheduler.spec import RunSpec
from loadgen.session import SessionOptions, execute
from loadgen.target import Target


async def _compare(sim_server: Any, tmp_path: Path, sglang_tokenizer: str) -> Any:
    llama = await sim_server("llamacpp", tokenizer="word", parallel=4)
    sgl = await sim_server("sglang", tokenizer=sglang_tokenizer, enable_cache_report=True)
    spec = RunSpec(
        targets=[Target("llama", llama.url, "llamacpp"), Target("sgl", sgl.url, "sglang")],
        max_tokens=16,
        concurrency=2,
        requests=4,
        prompt_tokens=64,
    )
    options = SessionOptions(out_dir=tmp_path, progress=False, print_table=False)
    return await execute([spec], options)


async def test_equal_tokenizers_give_a_valid_comparison(sim_server: Any, tmp_path: Path) -> None:
    result = await _compare(sim_server, tmp_path, "word")
    assert result.exit_code == 0, result.summary
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["valid"] is True
    llama, sgl = summary["steps"]
    assert llama["prompt_tokens"] == sgl["prompt_tokens"] == 64
    assert llama["completion_tokens"] == sgl["completion_tokens"] == 16
    assert llama["requests_ok"] == sgl["requests_ok"] == 4
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    # llama.cpp reports timings; SGLang (with --enable-cache-report) reports cached_tokens.
    assert all(r["server_predicted_per_second"] for r in records if r["engine"] == "llama")
    assert all(r["cached_tokens"] is not None for r in records)


async def test_different_tokenizers_are_invalid_in_every_output(
    sim_server: Any, tmp_path: Path
) -> None:
    result = await _compare(sim_server, tmp_path, "char4")
    assert result.exit_code == 3
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["valid"] is False
    assert "llama vs sgl: token counts differ" in summary["invalid_reasons"][0]
    assert (tmp_path / "summary.csv").read_text().startswith("# INVALID: ")
    assert "**INVALID**" in (tmp_path / "summary.md").read_text()
