"""`run --traffic-from`: the served mix read from Prometheus (the recorded SGLang answers of
tests/fixtures/served-mix-sglang) replayed against the streaming stub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.loadgen import main
from loadgen.served_mix import served_mix
from loadgen.traffic.spec import load_traffic
from tests.plugins.loadgen import StubFactory, request_lines, run_cli
from tests.plugins.prom import RecordedPrometheus
from tests.unit.test_served_mix import SGLANG, recorded

# The served rate is 7 requests an hour: replayed 10 000 times as fast (~0.05 s apart).
SCALE = 0.0001
COUNT = 40


def test_traffic_from_replays_the_served_lengths_at_the_served_rate(
    stub: StubFactory, tmp_path: Path
) -> None:
    answers, run = recorded(SGLANG)
    server = stub(ttft=0.001, itl=0.0002)
    mix_file = tmp_path / "served-mix.json"
    with RecordedPrometheus(answers) as prom:
        served = served_mix(prom.url, run["window"], run["engine"])
        source = ["--traffic-from", prom.url, "--traffic-window", run["window"]]
        args = [*source, "--traffic-engine", run["engine"], "--requests", str(COUNT)]
        # --concurrency lifts the served p90 cap (<= 2) so that no send waits for an answer;
        # completions: the served lengths count the chat template already, and the (0, 100]
        # bucket draws prompts shorter than the template.
        timing = ["--time-scale", str(SCALE), "--concurrency", "64", "--endpoint", "completions"]
        assert run_cli(tmp_path / "out", "--url", server.url, *args, *timing) == 0
        assert main(["served-mix", "--prometheus", prom.url, "--window", run["window"],
                     "--engine", run["engine"], "--out", str(mix_file)]) == 0  # fmt: skip
    # The same requests as replaying the file `served-mix` writes.
    want = load_traffic(str(mix_file), COUNT).requests
    lines = sorted(request_lines(tmp_path / "out"), key=lambda r: r["index"])
    assert len(lines) == COUNT and all(r["error"] is None for r in lines)
    assert [r["prompt_tokens_target"] for r in lines] == [q.prompt_tokens for q in want]
    assert all(r["prompt_tokens"] == r["prompt_tokens_target"] for r in lines)
    # The prompt lengths follow the served buckets: (0, 100] 4 of 7, (100, 300] 3 of 7.
    bounds = [ub for ub, _ in served.prompt.buckets]
    assert bounds == [100.0, 300.0]
    prompts = [r["prompt_tokens"] for r in lines]
    assert all(1 <= p <= 300 for p in prompts)
    short = sum(1 for p in prompts if p <= 100) / COUNT
    assert short == pytest.approx(4 / 7, abs=0.2)
    # The sends keep the served rate (scaled): Poisson arrivals, 40 of them.
    starts = [r["start_time"] for r in lines]
    sent_rate = (COUNT - 1) / (max(starts) - min(starts)) * SCALE
    assert sent_rate == pytest.approx(served.rate_per_second, rel=0.4)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    mix = summary["run"]["traffic_mix"]
    assert mix["source"].startswith(f"served mix of {run['engine']} over the last 1h")
    assert mix["requests"] == COUNT
    # As sent: the served rate at --time-scale SCALE (every time multiplied by it).
    assert mix["time_scale"] == SCALE
    assert mix["rate_per_s"] == pytest.approx(served.rate_per_second / SCALE, rel=0.4)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--traffic", "mix:prompt=fixed:8,output=fixed:2"), "--traffic or --traffic-from"),
        (("--prompt-tokens", "64"), "--traffic-from gives the lengths and times; drop"),
    ],
)
def test_traffic_from_clashes_are_one_line(
    stub: StubFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    words: str,
) -> None:
    server = stub()
    answers, _ = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        code = run_cli(tmp_path / "o", "--url", server.url, "--traffic-from", prom.url, *args)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_traffic_from_errors_are_served_mix_errors(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = stub()
    answers, run = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        args = ["--traffic-from", prom.url, "--traffic-engine", "nope"]
        assert run_cli(tmp_path / "o", "--url", server.url, *args) == 2
    err = capsys.readouterr().err
    assert "--traffic-from: Prometheus at" in err and f"samples of {run['engine']}" in err
    # run's own flags, not served-mix's (--engine names the load's engine in run).
    assert "pass --traffic-engine NAME or a longer --traffic-window" in err, err
    assert run_cli(tmp_path / "o", "--url", server.url, "--traffic-engine", "sgl") == 2
    assert "--traffic-engine goes with --traffic-from" in capsys.readouterr().err
    assert server.state.requests == 0
