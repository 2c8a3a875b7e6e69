"""`llmb-loadgen run --workers N`: worker processes against the stub, merged into one report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from statistics import mean

import httpx
import pytest

from loadgen.metrics import LoadgenMetrics
from loadgen.results import percentile
from loadgen.scheduler.spec import RunSpec
from loadgen.session import SessionOptions
from loadgen.target import Target
from loadgen.workers import execute_workers, split_spec
from tests.conftest import get_free_port
from tests.plugins.loadgen import StubFactory, request_lines, run_cli


def test_split_spec_shares_add_up_and_interleave() -> None:
    spec = RunSpec(
        targets=[Target("t", "http://127.0.0.1:1")], concurrency=7, requests=23, warmup=3
    )
    shares = split_spec(spec, 3)
    assert [s.concurrency for s in shares] == [3, 2, 2]
    assert [s.requests for s in shares] == [8, 8, 7]
    assert sum(s.warmup for s in shares) == 3
    indexes = sorted(
        s.index_start + i * s.index_step for s in shares for i in range(s.requests or 0)
    )
    assert indexes == list(range(23))
    assert len({s.arrival_seed for s in shares}) == 3
    open_loop = split_spec(
        RunSpec(targets=spec.targets, concurrency=None, rate=30.0, requests=30), 2
    )
    assert [s.rate for s in open_loop] == [15.0, 15.0]
    assert [s.concurrency for s in open_loop] == [None, None]
    assert [s.arrival_offset for s in open_loop] == pytest.approx([0.0, 1 / 30])
    with pytest.raises(ValueError, match="concurrency"):
        split_spec(spec, 8)


def test_a_ramp_is_shared_by_the_workers_without_collisions() -> None:
    spec = RunSpec(targets=[Target("t", "http://127.0.0.1:1")], concurrency=8, ramp_up=0.8)
    assert [spec.start_delay(i) for i in range(8)] == pytest.approx([i / 10 for i in range(8)])
    assert spec.phase_deadline() == pytest.approx(0.8 + 4 * (spec.timeout + 5.0))
    shares = split_spec(spec, 2)
    starts = sorted(s.start_delay(i) for s in shares for i in range(s.concurrency or 0))
    # Two workers of four slots each interleave into the one ramp of eight.
    assert starts == pytest.approx([i / 10 for i in range(8)])
    assert RunSpec(targets=spec.targets, concurrency=8).start_delay(7) == 0.0


def test_two_workers_merge_into_one_report(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(ttft=0.01, itl=0.003)
    args = ("--url", server.url, "--prompt-tokens", "48", "--max-tokens", "10")
    code = run_cli(tmp_path, *args, "--concurrency", "4", "--requests", "30", "--workers", "2")
    assert code == 0
    lines = request_lines(tmp_path)
    # One requests.jsonl with every request once, the indexes of a one-process run.
    assert sorted(r["index"] for r in lines) == list(range(30))
    assert all(r["error"] is None and r["completion_tokens"] == 10 for r in lines)
    # No two workers sent the same prompt (the unique-prefix cache mode still holds).
    measured = [p for p in server.state.prompts if len(p.split()) > 5][-30:]
    assert len(set(measured)) == 30
    # Each worker kept 2 in flight: the stub saw the total concurrency at once.
    assert server.state.max_in_flight == 4
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["valid"] and summary["run"]["workers"] == 2
    (step,) = summary["steps"]
    assert step["requests"] == 30 and step["concurrency"] == 4 and step["workers"] == 2
    # Percentiles are recomputed from the merged per-request records, not averaged.
    ttfts = [r["ttft_s"] for r in lines]
    e2es = [r["e2e_s"] for r in lines]
    assert step["ttft_p90_s"] == pytest.approx(percentile(ttfts, 90), abs=1e-6)
    assert step["e2e_p99_s"] == pytest.approx(percentile(e2es, 99), abs=1e-6)
    wall = max(r["end_time"] for r in lines) - min(r["start_time"] for r in lines)
    assert step["wall_s"] == pytest.approx(wall, abs=1e-5)
    assert step["output_tok_s"] == pytest.approx(300 / wall, rel=1e-3)
    # The inter-token gaps travel with the records: the step's ITL is taken over every gap of
    # every worker's records (nine gaps each, so the mean of the record means). Not the stub's
    # 3 ms: on a busy 2-core machine the client reads several chunks in one go, and their gaps
    # are truly ~0 as seen from the client.
    assert step["itl_mean_s"] == pytest.approx(mean(r["itl_mean_s"] for r in lines), abs=2e-6)
    assert 0 <= step["itl_p50_s"] <= step["itl_p99_s"] < 0.1


def test_open_loop_rate_is_shared(stub: StubFactory, tmp_path: Path) -> None:
    server = stub()
    args = ("--url", server.url, "--prompt-tokens", "32", "--max-tokens", "4")
    code = run_cli(
        tmp_path, *args, "--rate", "40", "--arrival", "constant", "--requests", "40",
        "--workers", "2",
    )  # fmt: skip
    assert code == 0
    lines = sorted(request_lines(tmp_path), key=lambda r: r["start_time"])
    assert len(lines) == 40
    starts = [r["start_time"] for r in lines]
    # Two workers at 20/s each, offset by half a period: together one 40/s stream.
    achieved = (len(starts) - 1) / (starts[-1] - starts[0])
    assert achieved == pytest.approx(40.0, rel=0.15)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"][0]["rate"] == 40.0


def test_too_many_workers_is_a_usage_error(stub: StubFactory, tmp_path: Path) -> None:
    server = stub()
    code = run_cli(tmp_path, "--url", server.url, "--concurrency", "2", "--workers", "3")
    assert code == 2
    assert not (tmp_path / "requests.jsonl").exists()


async def test_parent_serves_live_metrics_of_all_workers(stub: StubFactory) -> None:
    server = stub(itl=0.01)
    spec = RunSpec(
        targets=[Target("stub", server.url)],
        max_tokens=20,
        concurrency=4,
        requests=40,
        prompt_text="Explain the memory hierarchy of a GPU.",
    )
    port = get_free_port()
    metrics = LoadgenMetrics()
    options = SessionOptions(
        out_dir=None, metrics_port=port, metrics_host="127.0.0.1", progress=False,
        print_table=False, metrics=metrics,
    )  # fmt: skip
    task = asyncio.create_task(execute_workers(spec, options, 2))
    seen_mid_run: float | None = None
    async with httpx.AsyncClient(timeout=2.0) as client:
        for _ in range(200):  # bounded: 20 s
            await asyncio.sleep(0.1)
            if task.done():
                break
            try:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                if line.startswith('llmb_loadgen_requests_total{engine="stub",outcome="ok"}'):
                    value = float(line.split()[-1])
                    if 0 < value < 40:
                        seen_mid_run = value
            if seen_mid_run is not None:
                break
    result = await asyncio.wait_for(task, 60)
    assert result.exit_code == 0
    assert seen_mid_run is not None, "the parent's /metrics never showed a partial count"
    reg = metrics.registry
    labels = {"engine": "stub", "outcome": "ok"}
    assert reg.get_sample_value("llmb_loadgen_requests_total", labels) == 40
    assert reg.get_sample_value("llmb_loadgen_completion_tokens_total", {"engine": "stub"}) == 800
    ttft_count = reg.get_sample_value(
        "llmb_loadgen_time_to_first_token_seconds_count", {"engine": "stub"}
    )
    assert ttft_count == 40
    assert reg.get_sample_value("llmb_loadgen_requests_in_flight", {"engine": "stub"}) == 0


def test_unreachable_target_fails_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{get_free_port()}"
    code = run_cli(
        tmp_path, "--url", url, "--concurrency", "2", "--requests", "4", "--workers", "2",
        "--connect-timeout", "1",
    )  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("cannot reach") == 1, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["aborted"] is True and summary["valid"] is False and summary["steps"] == []
    assert "cannot reach" in summary["abort_reason"]
