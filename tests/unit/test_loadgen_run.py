"""`llmb-loadgen run` end to end against the streaming stub on 127.0.0.1: outputs, load shapes,
prompt-cache control, verification, live metrics, configuration and argument errors."""

from __future__ import annotations

import asyncio
import csv
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.slo import parse_slo
from loadgen.metrics import FAMILIES, LoadgenMetrics, StepStart, markdown_table
from loadgen.prompts import PromptSet, calibrate, filler
from loadgen.results import timed_record
from loadgen.scheduler.spec import RunSpec
from loadgen.session import SessionOptions, execute
from loadgen.target import Target
from simulator.stub import ThreadedStub
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.loadgen import StubFactory, request_lines, run_cli


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def _run_short(out: Path, server: ThreadedStub, max_tokens: int, *args: str) -> int:
    """`run` against `server` with 20-token prompts and `max_tokens`-token answers."""
    return run_cli(
        out, "--url", server.url, "--prompt-tokens", "20", "--max-tokens", str(max_tokens), *args
    )


def test_run_writes_records_and_summaries(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(ttft=0.02, itl=0.004)
    code = run_cli(
        tmp_path,
        *("--url", server.url, "--kind", "llamacpp", "--prompt-tokens", "64"),
        *("--max-tokens", "12", "--concurrency", "3", "--requests", "9", "--warmup", "2"),
    )
    assert code == 0
    lines = request_lines(tmp_path)
    assert len(lines) == 9  # warm-up requests are not recorded
    assert sorted(r["index"] for r in lines) == list(range(9))
    for rec in lines:
        assert rec["error"] is None
        assert rec["prompt_tokens"] == 64 and rec["completion_tokens"] == 12
        assert rec["cached_tokens"] == 0  # unique prefixes: nothing reused
        assert rec["ttft_s"] >= 0.02 and rec["e2e_s"] >= 0.02 + 11 * 0.004
        # p50 may be 0: on a busy machine the client reads chunks the stub sent 4 ms apart in one
        # go. Their mean cannot be: the last chunk left the stub 44 ms after the first.
        assert 0 <= rec["itl_p50_s"] < 0.05 and rec["itl_mean_s"] > 0
        assert rec["server_predicted_per_second"] == pytest.approx(250.0)
        for key in ("itl_mean_s", "itl_p99_s", "tpot_s", "start_time", "server_prompt_ms"):
            assert rec[key] is not None
    summary = _summary(tmp_path)
    assert summary["valid"] is True and summary["invalid_reasons"] == []
    (step,) = summary["steps"]
    assert step["requests_ok"] == 9 and step["requests_failed"] == 0
    assert step["concurrency"] == 3 and step["prompt_tokens"] == 64
    assert step["completion_tokens"] == 12 and step["output_tokens_total"] == 108
    assert step["ttft_p50_s"] <= step["ttft_p90_s"] <= step["ttft_p99_s"]
    # Client decode speed against the stub's exact 4 ms schedule (llama.cpp's formula).
    assert step["decode_tok_s_mean"] == pytest.approx(250.0, rel=0.25)
    assert step["output_tok_s"] == pytest.approx(108 / step["wall_s"], rel=1e-3)
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    # With --url and no --name, the engine is named after the model of /v1/models.
    assert rows[0]["engine"] == "stub-model" and rows[0]["valid"] == "true"
    assert "| stub-model | 0 | 3 | 64 | 12 | 9 | 0 |" in (tmp_path / "summary.md").read_text()
    # Closed loop: exactly `concurrency` requests were in flight at the stub.
    assert server.state.max_in_flight == 3
    body = server.state.bodies[-1]
    assert body["temperature"] == 0 and body["seed"] == 1234 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 12 and body["model"] == "stub-model"


def test_cache_unique_and_same(stub: StubFactory, tmp_path: Path) -> None:
    server = stub()
    args = ("--url", server.url, "--prompt-tokens", "40", "--max-tokens", "4", "--requests", "6")
    assert run_cli(tmp_path / "u", *args, "--cache", "unique") == 0
    unique = server.state.prompts[-6:]
    assert len(set(unique)) == 6
    assert {len(p.split()) for p in unique} == {len(unique[0].split())}
    assert {r["prompt_tokens"] for r in request_lines(tmp_path / "u")} == {40}
    assert run_cli(tmp_path / "s", *args, "--cache", "same") == 0
    same = server.state.prompts[-6:]
    assert len(set(same)) == 1
    cached = [r["cached_tokens"] for r in request_lines(tmp_path / "s")]
    assert max(cached) == 39  # the stub reuses all but one token of a repeated prompt


def test_completions_endpoint_and_prompt_file(stub: StubFactory, tmp_path: Path) -> None:
    server = stub()
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Tell me about GPUs and memory bandwidth.")
    code = run_cli(
        tmp_path / "o",
        *("--url", server.url, "--endpoint", "completions", "--prompt-file", str(prompt)),
        *("--max-tokens", "5", "--requests", "3"),
    )
    assert code == 0
    assert all(p.endswith("Tell me about GPUs and memory bandwidth.") for p in server.state.prompts)
    assert "prompt" in server.state.bodies[0] and "messages" not in server.state.bodies[0]
    assert {r["prompt_tokens"] for r in request_lines(tmp_path / "o")} == {14}


def test_open_loop_constant_rate(stub: StubFactory, tmp_path: Path) -> None:
    server = stub()
    t0 = time.perf_counter()
    code = _run_short(
        tmp_path, server, 3, "--rate", "40", "--arrival", "constant", "--requests", "20"
    )
    assert code == 0
    starts = sorted(r["start_time"] for r in request_lines(tmp_path))
    # 20 arrivals 25 ms apart span 475 ms.
    assert starts[-1] - starts[0] == pytest.approx(0.475, abs=0.05)
    assert time.perf_counter() - t0 < 10


def test_duration_bounds_the_run(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(itl=0.01)
    t0 = time.perf_counter()
    code = _run_short(tmp_path, server, 10, "--concurrency", "2", "--duration", "1")
    elapsed = time.perf_counter() - t0
    assert code == 0
    lines = request_lines(tmp_path)
    assert 6 <= len(lines) <= 25
    assert max(r["start_time"] for r in lines) - min(r["start_time"] for r in lines) < 1.0
    assert elapsed < 6


def test_ramp_up_spreads_the_closed_loop_start(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(ttft=0.4)  # longer than the ramp: the first three starts are the slots'
    args = ("--concurrency", "3", "--requests", "6")
    assert _run_short(tmp_path / "burst", server, 2, *args) == 0
    assert _run_short(tmp_path / "ramp", server, 2, *args, "--ramp-up", "0.36") == 0

    def first_starts(out: Path) -> list[float]:
        starts = sorted(r["start_time"] for r in request_lines(out))[:3]
        return [s - starts[0] for s in starts]

    # Without a ramp the three workers send at once; with --ramp-up 0.36 one every 0.12 s.
    assert first_starts(tmp_path / "burst")[-1] < 0.05
    assert first_starts(tmp_path / "ramp") == pytest.approx([0.0, 0.12, 0.24], abs=0.05)
    # Each slot's second request follows its own first, so the spread holds: no wave.
    later = sorted(r["start_time"] for r in request_lines(tmp_path / "ramp"))[3:]
    assert [b - a for a, b in itertools.pairwise(later)] == pytest.approx([0.12] * 2, abs=0.05)
    assert server.state.max_in_flight == 3
    summary = _summary(tmp_path / "ramp")
    assert summary["steps"][0]["requests_ok"] == 6


def test_failures_are_recorded_and_the_run_goes_on(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(fail_every=4, malformed_every=5)
    # --max-errors 1: never abort for the error share.
    code = _run_short(tmp_path, server, 6, "--requests", "20", "--max-errors", "1")
    lines = request_lines(tmp_path)
    assert len(lines) == 20
    errors = {r["error"] for r in lines}
    assert {"http_error", "malformed", None} <= errors
    document = _summary(tmp_path)
    summary = document["steps"][0]
    assert summary["requests_failed"] == sum(1 for r in lines if r["error"])
    assert summary["errors"]["http_error"] >= 3
    # Fewer than half failed: the run went on to the end, but the step is invalid, with why.
    assert document["aborted"] is False and document["valid"] is False
    failed = summary["requests_failed"]
    assert f"{failed} of 20 requests failed (http_error" in document["invalid_reasons"][0]
    assert summary["valid"] is False and "requests failed" in summary["invalid_reasons"][0]
    assert code == 3


def test_too_many_errors_abort_the_run(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(fail_every=4, malformed_every=5)
    code = _run_short(
        tmp_path, server, 6, "--requests", "200", "--max-errors", "0.2", "--concurrency", "1,2"
    )
    assert code == 1
    document = _summary(tmp_path)
    assert document["aborted"] is True and document["valid"] is False
    assert document["abort_reason"].startswith("step 0: too many errors: stub-model: ")
    assert "(limit 20%)" in document["abort_reason"]
    lines = request_lines(tmp_path)
    # Judged after 8 finished requests, so the step stopped long before its 200 and the
    # second step (concurrency 2) never ran.
    assert 8 <= len(lines) < 40 and {r["step"] for r in lines} == {0}
    assert len(document["steps"]) == 1


def test_timeout_per_request(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(itl=0.1)
    t0 = time.perf_counter()
    code = _run_short(
        tmp_path, server, 30, "--requests", "2", "--timeout", "0.5", "--concurrency", "2"
    )
    # A whole round of timeouts in a row: the engine is not answering, the run is aborted.
    assert code == 1
    reason = _summary(tmp_path)["abort_reason"]
    assert reason.startswith("step 0: engine not answering: stub-model: 2 requests in a row")
    assert [r["error"] for r in request_lines(tmp_path)] == ["timeout", "timeout"]
    assert time.perf_counter() - t0 < 5


def test_early_stop_marks_the_run_invalid(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(stop_after=5)
    code = _run_short(tmp_path, server, 8, "--requests", "3")
    assert code == 3
    assert [r["error"] for r in request_lines(tmp_path)] == ["early_stop"] * 3
    summary = _summary(tmp_path)
    assert summary["valid"] is False and "stopped early" in summary["invalid_reasons"][0]


def _two_engine_config(tmp_path: Path, a: ThreadedStub, b: ThreadedStub) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "engines:\n"
        f"  - {{name: llama, kind: llamacpp, url: '{a.url}'}}\n"
        f"  - {{name: sgl, kind: sglang, url: '{b.url}'}}\n"
        # One loadgen: mapping for every subcommand: `contexts` is diagnose's, run ignores it.
        "loadgen: {max_tokens: 6, contexts: '1024,2048'}\n"
    )
    return path


def test_two_engines_with_equal_tokenizers_are_valid(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = stub(), stub()
    config = _two_engine_config(tmp_path, a, b)
    code = run_cli(
        tmp_path / "o",
        *("--config", str(config), "--engine", "llama", "--engine", "sgl"),
        *("--prompt-tokens", "30", "--requests", "4"),
    )
    assert code == 0
    # Same prompts, same order, on both engines; max_tokens came from the config's loadgen:.
    assert a.state.prompts[-4:] == b.state.prompts[-4:]
    assert b.state.bodies[-1]["max_tokens"] == 6
    summary = _summary(tmp_path / "o")
    assert summary["valid"] is True
    assert [s["engine"] for s in summary["steps"]] == ["llama", "sgl"]
    out = capsys.readouterr().out
    assert "INVALID" not in out
    # One vertical block per engine (vllm bench serve style), the validity said once.
    assert out.count("Median TTFT (ms):") == 2 and out.count("P99 ITL (ms):") == 2
    assert out.count("Result: VALID") == 1
    assert all(len(line) <= 60 for line in out.splitlines())


def test_two_engines_with_different_tokenizers_are_invalid_everywhere(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = stub(), stub(token_factor=1.5)
    config = _two_engine_config(tmp_path, a, b)
    out = tmp_path / "o"
    code = run_cli(
        out,
        *("--config", str(config), "--engine", "llama", "--engine", "sgl"),
        *("--prompt-tokens", "30", "--requests", "4"),
    )
    assert code == 3
    summary = _summary(out)
    assert summary["valid"] is False
    assert "llama vs sgl: token counts differ on 4 of 4" in summary["invalid_reasons"][0]
    assert all(s["valid"] is False for s in summary["steps"])
    csv_text = (out / "summary.csv").read_text()
    assert csv_text.startswith("# INVALID: ")
    assert {row["valid"] for row in csv.DictReader(csv_text.splitlines()[1:])} == {"false"}
    assert "**INVALID**" in (out / "summary.md").read_text()
    assert "INVALID:" in capsys.readouterr().out


async def test_live_metrics_during_a_run(stub: StubFactory, tmp_path: Path) -> None:
    a, b = stub(itl=0.01), stub(itl=0.01, token_factor=2.0)
    port = get_free_port()
    metrics = LoadgenMetrics()
    spec = RunSpec(
        targets=[Target("a", a.url), Target("b", b.url)],
        max_tokens=20,
        concurrency=2,
        requests=6,
        prompt_tokens=30,
    )
    options = SessionOptions(
        out_dir=tmp_path, metrics_port=port, metrics_host="127.0.0.1", metrics=metrics,
        progress=False, print_table=False,
    )  # fmt: skip
    task = asyncio.create_task(execute([spec], options))
    pages: list[str] = []
    async with aiohttp.ClientSession() as session:
        while not task.done():
            try:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    pages.append(await resp.text())
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    result = await task
    assert result.exit_code == 3
    live = {
        s.name: s
        for page in pages
        for fam in text_string_to_metric_families(page)
        for s in fam.samples
        if s.name == "llmb_loadgen_requests_in_flight" and s.value == 2
    }
    assert live, "no scrape saw two requests in flight"
    step_infos = [p for p in pages if 'llmb_loadgen_step_info{concurrency="2",engine="a"' in p]
    assert step_infos and 'max_tokens="20"' in step_infos[0]
    get = metrics.registry.get_sample_value
    assert get("llmb_loadgen_requests_total", {"engine": "a", "outcome": "ok"}) == 6
    assert get("llmb_loadgen_completion_tokens_total", {"engine": "b"}) == 120
    assert get("llmb_loadgen_time_to_first_token_seconds_count", {"engine": "a"}) == 6
    assert get("llmb_loadgen_inter_token_latency_seconds_count", {"engine": "a"}) == 6 * 19
    assert get("llmb_loadgen_e2e_request_latency_seconds_count", {"engine": "b"}) == 6
    assert get("llmb_loadgen_token_count_mismatch", {"engine": "a"}) == 1
    assert get("llmb_loadgen_early_stop_requests_total", {"engine": "a"}) == 0
    assert get("llmb_loadgen_prompt_tokens_total", {"engine": "a"}) == 6 * 30
    assert (get("llmb_loadgen_step_start_timestamp_seconds", {"engine": "b"}) or 0) > 1.7e9
    # Each run owns a registry: a second one starts from zero.
    assert (
        LoadgenMetrics().registry.get_sample_value(
            "llmb_loadgen_requests_total", {"engine": "a", "outcome": "ok"}
        )
        is None
    )


def test_unreachable_target_fails_within_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.perf_counter()
    code = run_cli(tmp_path, "--url", f"http://127.0.0.1:{get_free_port()}", "--requests", "3")
    assert code == 1
    assert time.perf_counter() - t0 < 8
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no target"),
        (["--url", "localhost:8080"], "must start with http"),
        (["--engine", "llama"], "needs --config"),
        (["--url", "http://x", "--requests", "2", "--duration", "3"], "not both"),
        (["--url", "http://x", "--concurrency", "0"], "expected positive integers"),
        (["--url", "http://x", "--cache", "maybe"], "invalid choice"),
        (["--url", "http://x", "--rate", "5", "--ramp-up", "1"], "arrivals are already spread"),
        (["--url", "http://x", "--ramp-up", "-1"], "--ramp-up"),
    ],
)
def test_invalid_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert run_cli(tmp_path, *args) == 2
    assert message in capsys.readouterr().err


def test_invalid_config_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines:\n  - {name: a, kind: vllm, url: 'http://127.0.0.1:1'}\n")
    assert run_cli(tmp_path, "--config", str(bad), "--engine", "a") == 2
    assert "engines.0(a).kind" in capsys.readouterr().err
    good = tmp_path / "good.yaml"
    good.write_text("engines:\n  - {name: a, kind: llamacpp, url: 'http://127.0.0.1:1'}\n")
    assert run_cli(tmp_path, "--config", str(good), "--engine", "b") == 2
    assert "no engine named 'b'" in capsys.readouterr().err
    typo = tmp_path / "typo.yaml"
    typo.write_text("loadgen: {max_tokenz: 3}\n")
    assert run_cli(tmp_path, "--config", str(typo), "--url", "http://127.0.0.1:1") == 2
    assert "loadgen.max_tokenz: unknown key" in capsys.readouterr().err


async def test_calibration_hits_the_target_with_an_uneven_tokenizer() -> None:
    calls: list[str] = []

    async def count(text: str) -> int:
        calls.append(text)
        words = text.split()
        # Long words cost two tokens: the words->tokens curve is not 1:1.
        return 3 + sum(2 if len(w) > 4 else 1 for w in words)

    prompts = await calibrate(300, count)
    assert isinstance(prompts, PromptSet)
    assert prompts.measured_tokens == 300
    assert await count(prompts.text(0)) == 300 and await count(prompts.text(77777)) == 300
    assert len(calls) < 20
    assert filler(3) == "the quick brown"


def test_metrics_doc_lists_every_series_as_the_registry_exposes_it() -> None:
    """docs/metrics.md's load generator table is `FAMILIES` rendered, and the registry
    exposes exactly those families, each of the type, labels and HELP the table says."""
    doc = (ROOT / "docs" / "metrics.md").read_text()
    section = doc[doc.index("## Load generator\n") :]
    assert markdown_table() in section
    assert set(re.findall(r"^\| `(llmb_loadgen_[a-z0-9_]+)`", section, re.M)) == set(FAMILIES)
    metrics = LoadgenMetrics(parse_slo("e2e_p99=1s"))  # with --slo: every series exists
    metrics.start_step(StepStart("e", 0, 1, 16, 8))
    metrics.observe(timed_record("e", 0, 0.0, 0.1, 0.5, 8))
    exposed = {}
    for fam in metrics.registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(fam.type, "")
        labels = {k for sample in fam.samples for k in sample.labels if k != "le"}
        exposed[fam.name + suffix] = (fam.type, labels, fam.documentation)
    assert set(exposed) == set(FAMILIES)
    for name, family in FAMILIES.items():
        # The doc's type is client_python's, an info's with how it is exposed beside it.
        kind = family.type.split(" ")[0]
        assert exposed[name] == (kind, set(family.labels), family.meaning), name


def test_commands_plug_in(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from cli.loadgen import build_parser, default_commands
    from loadgen.options import Command

    seen: list[argparse.Namespace] = []

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--level", type=int)

    def run(args: argparse.Namespace) -> int:
        seen.append(args)
        return 7

    commands = [*default_commands(), Command("probe", "a test command", configure, run)]
    names = [c.name for c in commands]
    assert names[:2] == ["run", "sweep"] and "probe" in names
    args = build_parser(commands).parse_args(["probe", "--level", "3"])
    assert args.func(args) == 7 and seen[0].level == 3
