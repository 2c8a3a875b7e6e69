"""`diagnose --traffic` and `compare --traffic` against the llama.cpp simulator, launched
through real launch templates: the load step replays a Mooncake trace written here (shared
`hash_ids`), the verdict and the call come from it, and results.json carries the mix, the
engine's own prefix-cache hit rate and the per-request token check."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main as loadgen_main
from loadgen.traffic.spec import load_traffic
from tests.integration.test_compare_sim import sim_config

pytestmark = pytest.mark.timeout(300)


def trace_rows() -> list[dict[str, Any]]:
    """Twelve requests over 1.1 s: every one opens with the same 512-token block (id 7), then
    a block of its own; output lengths 8 to 19, so `max_tokens` alone cannot check them."""
    return [
        {"timestamp": 100 * i, "input_length": 600 + 40 * i, "output_length": 8 + i,
         "hash_ids": [7, 1000 + i]}
        for i in range(12)
    ]  # fmt: skip


def write_trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in trace_rows()))
    return path


def run_cli(
    tmp_path: Path, command: str, *engines: tuple[str, str, str, str], extra: tuple[str, ...] = ()
) -> dict:
    """`command` --traffic over simulators launched from a config; results.json."""
    cfg = sim_config(tmp_path, *engines)
    cfg_file = tmp_path / "config.json"
    cfg_file.write_text(json.dumps(cfg.model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "out"
    names = [arg for e in engines for arg in ("--engine", e[0])]
    code = loadgen_main(
        [command, "--config", str(cfg_file), *names, "--out", str(out), "--concurrency", "4",
         "--traffic", str(write_trace(tmp_path)), "--time-scale", "0.5",
         "--slo", "ttft_p50=5s", *extra]
    )  # fmt: skip
    assert code == 0
    return json.loads((out / "results.json").read_text())


def check_mix(engine: dict, trace: Path) -> None:
    """The mix in results.json is the trace's, as the load generator describes it."""
    described = load_traffic(str(trace)).describe()
    mix = engine["traffic"]
    assert mix["source"] == str(trace) and mix["requests"] == 12
    assert mix["scheduled"] is True and mix["time_scale"] == 0.5 and mix["concurrency"] == 4
    # 11 gaps over 1.1 s of trace, replayed twice as fast.
    assert mix["rate_per_s"] == pytest.approx(20.0)
    assert mix["shared_prefix_share"] == pytest.approx(described["shared_prefix_share"])
    assert mix["shared_prefix_share"] > 0.5
    assert mix["prompt_tokens"]["max"] == 600 + 40 * 11
    assert sum(n for _, n in mix["prompt_tokens"]["histogram"]) == 12
    assert mix["output_tokens"]["histogram"] == [[8, 1], [16, 8], [32, 3]]


def check_traffic_row(engine: dict, rounds: int) -> None:
    """The one load row is the trace, every request's usage as the trace asked."""
    rows = [r for r in engine["rows"] if r["step"] != "first"]
    assert [r["step"] for r in rows] == ["concurrency"], rows
    row = rows[0]
    assert row["requests"] == 12 * rounds and row["requests_failed"] == 0
    assert row["tokens_ok"] is True and row["tokens_off"] == 0
    assert row["completion_tokens"] == rounds * sum(8 + i for i in range(12))
    # The shared block is the simulator's own cached tokens (its counters, not a gauge).
    assert row["prompt_cache_hit_ratio"] is not None and row["prompt_cache_hit_ratio"] > 0.3
    # Replayed on its schedule: how late the sends went out is measured, never shifted.
    assert row["late_sends"] is not None and 0 <= row["late_sends"] <= row["requests"]
    assert row["send_error_p99_s"] is not None and row["send_error_p99_s"] >= 0
    # And no more than the trace shares within a round (block 7 after its first use, the
    # opening word and BOS): a later round's prompts are not the earlier rounds' again.
    within = (11 * 512 + 12 * 2) / sum(r["input_length"] for r in trace_rows())
    assert row["prompt_cache_hit_ratio"] <= within, row["prompt_cache_hit_ratio"]


def test_diagnose_answers_under_the_traffic(tmp_path: Path, capsys: Any) -> None:
    doc = run_cli(tmp_path, "diagnose", ("llama", "llamacpp", "healthy", "-np 4 -c 16384"))
    printed = capsys.readouterr().out
    (engine,) = doc["engines"]
    assert doc["verdict"]["llama"] == engine["verdict"] and engine["verdict"] is not None
    check_mix(engine, tmp_path / "trace.jsonl")
    check_traffic_row(engine, rounds=1)
    steps = {s["key"]: s for s in doc["decision"]["steps"]}
    for key in ("single", "kv_pressure", "context"):
        assert "skipped under --traffic" in steps[key]["answer"], steps[key]
    assert steps["concurrency"]["answer"].startswith("your traffic, c=4:")
    assert "prefix cache" in steps["concurrency"]["answer"]
    # Goodput under --slo, judged from the traffic's requests.
    assert "slo" in steps and doc["decision"]["slo"]["steps"]["llama"][0]["requests"] == 12
    assert "your traffic" in printed and "shared prefix" in printed
    assert "## Your traffic" in (tmp_path / "out" / "report.md").read_text()
    assert 'id="traffic"' in (tmp_path / "out" / "report.html").read_text()


def test_compare_sends_both_engines_the_same_schedule(tmp_path: Path, capsys: Any) -> None:
    same = ("llamacpp", "healthy", "-np 4 -c 16384")
    doc = run_cli(tmp_path, "compare", ("a", *same), ("b", *same))
    printed = capsys.readouterr().out
    # Each engine's own figures under the traffic, and the mix once.
    for name in ("a", "b"):
        assert re.search(
            rf"^under traffic +{name}: .*prefix cache \d+% of prompt tokens", printed, re.M
        )
    assert printed.count("your traffic    ") == 1
    a, b = doc["engines"]
    assert a["traffic"] == b["traffic"]
    check_mix(a, tmp_path / "trace.jsonl")
    for engine in (a, b):
        check_traffic_row(engine, rounds=3)
    # The same prompts at the same times: request by request the same lengths.
    records = [
        json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()
    ]
    rounds: dict[tuple[str, int], dict[int, float]] = {}
    for r in records:
        # When the replay meant to send it (the send itself may wait for the in-flight cap).
        due = r["start_time"] - r["send_error_s"]
        rounds.setdefault((r["engine"], r["step"]), {})[r["index"]] = due
    assert sorted(name for name, _ in rounds) == ["a"] * 3 + ["b"] * 3
    for starts in rounds.values():
        # Each round scheduled the twelve on the trace's clock (100 ms apart, at half time).
        assert sorted(starts) == list(range(12))
        for index, at in starts.items():
            assert at - starts[0] == pytest.approx(0.05 * index, abs=0.002)
    asked = {
        name: sorted((r["index"], r["prompt_tokens"], r["completion_tokens"])
                     for r in records if r["engine"] == name)
        for name in ("a", "b")
    }  # fmt: skip
    assert asked["a"] == asked["b"]
    # Identical engines: nothing differs beyond the noise.
    assert doc["recommendation"] == "stay", doc["action"]
    assert doc["verdict"]["a"] == doc["verdict"]["b"]


def test_a_radix_cache_gets_no_hit_from_an_earlier_round(tmp_path: Path) -> None:
    """SGLang's radix cache keeps every prompt: were the rounds the same text, rounds 2 and 3
    would be served whole from it. Each round's own text leaves the trace's shared block."""
    engine = ("sgl", "sglang", "healthy", "")
    doc = run_cli(tmp_path, "diagnose", engine, extra=("--rounds", "3"))
    (result,) = doc["engines"]
    check_traffic_row(result, rounds=3)
