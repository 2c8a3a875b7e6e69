"""`llmb-loadgen run --traffic` against the streaming stub: token-exact prompts and outputs,
the schedule kept (send errors recorded, late sends counted, never shifted), sessions waiting
for their answers, shared blocks reaching the engine as the same text, and usage errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from loadgen.traffic.prompts import sample_text
from loadgen.traffic.spec import load_traffic
from tests.plugins.loadgen import StubFactory, request_lines, run_cli
from tests.unit.test_traffic_sources import MOONCAKE


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def _trace(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_example_trace_replays_token_exact_on_its_schedule(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = stub(ttft=0.01, itl=0.002)
    code = run_cli(tmp_path, "--url", server.url, "--traffic", str(MOONCAKE), "--time-scale", "0.5")
    assert code == 0
    traffic = load_traffic(str(MOONCAKE))
    lines = sorted(request_lines(tmp_path), key=lambda r: r["index"])
    assert [r["index"] for r in lines] == list(range(len(traffic.requests)))
    for rec, req in zip(lines, traffic.requests, strict=True):
        assert rec["error"] is None
        assert rec["prompt_tokens"] == rec["prompt_tokens_target"] == req.prompt_tokens
        assert rec["completion_tokens"] == req.output_tokens
        assert 0 <= rec["send_error_s"] < 0.5
    first = lines[0]["start_time"]
    for rec, req in zip(lines, traffic.requests, strict=True):
        if req.turn == 0:  # singles and first turns go out at their (scaled) time
            assert rec["start_time"] - first == pytest.approx(req.at_s * 0.5, abs=0.5)
    # A later turn waits for the answer before it, then the think time (scaled).
    for indexes in traffic.sessions().values():
        for before, after in itertools.pairwise(indexes):
            gap = lines[after]["start_time"] - lines[before]["end_time"]
            assert gap >= traffic.requests[after].think_s * 0.5 - 0.002
    step = _summary(tmp_path)["steps"][0]
    assert step["valid"] and step["prompt_tokens_off"] == 0
    assert step["send_error_p99_s"] is not None and step["late_sends"] >= 0
    run = _summary(tmp_path)["run"]
    assert run["traffic_mix"]["requests"] == 26 and run["traffic_mix"]["sessions"] == 2
    # The console block says how the schedule was kept, and the lengths as their range.
    console = capsys.readouterr().out
    assert "traffic replayed on its schedule" in console and "Send error p99 (ms)" in console
    assert "300..1966 (23 distinct)" in console
    # The stub caches a prompt whose first 8 words began an earlier one: the shared blocks
    # reached it as the same words.
    pairs = zip(lines, traffic.requests, strict=True)
    shared = [rec for rec, req in pairs if req.blocks[0][0] < 100]
    assert sum(1 for r in shared if r["cached_tokens"]) >= len(shared) - 3


def test_open_loop_never_waits_for_answers(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(ttft=0.6, itl=0.001)
    rows = [{"timestamp": 20 * i, "input_length": 40, "output_length": 4} for i in range(10)]
    trace = _trace(tmp_path / "t.jsonl", rows)
    assert run_cli(tmp_path / "out", "--url", server.url, "--traffic", str(trace)) == 0
    lines = request_lines(tmp_path / "out")
    starts = sorted(r["start_time"] for r in lines)
    # All ten went out within the 0.18 s schedule, long before the first answer (0.6 s).
    assert starts[-1] - starts[0] < 0.4
    assert server.state.max_in_flight == 10


def test_late_sends_are_counted_not_shifted(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(ttft=0.15, itl=0.001)
    rows = [{"timestamp": 10 * i, "input_length": 30, "output_length": 2} for i in range(6)]
    trace = _trace(tmp_path / "t.jsonl", rows)
    out = tmp_path / "out"
    # One request in flight at most: each waits for the one before, so sends go out late.
    assert run_cli(out, "--url", server.url, "--traffic", str(trace), "--concurrency", "1") == 0
    lines = sorted(request_lines(out), key=lambda r: r["index"])
    errors = [r["send_error_s"] for r in lines]
    assert errors[-1] > 0.5  # the last was due at 0.05 s, went out after five answers
    step = _summary(out)["steps"][0]
    assert step["late_sends"] >= 4
    assert step["send_error_max_s"] == pytest.approx(max(errors), abs=1e-6)


def test_no_schedule_is_a_closed_loop(stub: StubFactory, tmp_path: Path) -> None:
    server = stub(ttft=0.01)
    rows = [{"timestamp": 1000 * i, "input_length": 30, "output_length": 3} for i in range(6)]
    trace = _trace(tmp_path / "t.jsonl", rows)
    out = tmp_path / "out"
    args = ("--traffic", str(trace), "--no-schedule", "--warmup", "2")
    assert run_cli(out, "--url", server.url, *args) == 0
    lines = request_lines(out)
    assert len(lines) == 6 and all("send_error_s" not in r for r in lines)
    # Two probes counted the template, two warm-up requests went unrecorded, then the six.
    assert server.state.requests == 2 + 2 + 6
    assert not set(server.state.prompts[2:4]) & set(server.state.prompts[4:])
    assert max(r["end_time"] for r in lines) - min(r["start_time"] for r in lines) < 2.0
    assert server.state.max_in_flight == 1


def test_a_mix_and_shared_prefixes(stub: StubFactory, tmp_path: Path) -> None:
    server = stub()
    spec = "shared-prefix:groups=2,prompts=3,system=64,question=16,output=5,rate=50"
    assert run_cli(tmp_path, "--url", server.url, "--traffic", spec) == 0
    lines = request_lines(tmp_path)
    assert len(lines) == 6 and {r["prompt_tokens"] for r in lines} == {80}
    assert sum(1 for r in lines if r["cached_tokens"]) == 4  # all but each group's first
    out = tmp_path / "mix"
    mix = "mix:prompt=uniform:20:200,output=fixed:3,concurrency=2,seed=5"
    assert run_cli(out, "--url", server.url, "--traffic", mix, "--requests", "12") == 0
    lines = request_lines(out)
    assert len(lines) == 12 and all(r["prompt_tokens"] == r["prompt_tokens_target"] for r in lines)
    assert len({r["prompt_tokens"] for r in lines}) > 6


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--prompt-tokens", "64"), "drop --prompt-tokens"),
        (("--rate", "2"), "drop --rate"),
        (("--workers", "2"), "drop --workers"),
        (("--concurrency", "1,2"), "one --concurrency value"),
    ],
)
def test_traffic_clashes_are_usage_errors(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple, words: str
) -> None:
    server = stub()
    assert run_cli(tmp_path, "--url", server.url, "--traffic", str(MOONCAKE), *args) == 2
    assert words in capsys.readouterr().err


def test_a_bad_trace_is_a_usage_error_naming_the_line(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = stub()
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 1}\n')
    assert run_cli(tmp_path / "out", "--url", server.url, "--traffic", str(trace)) == 2
    err = capsys.readouterr().err
    assert f"{trace} line 2: input_length: missing" in err
    assert not (tmp_path / "out").exists()


def test_time_scale_needs_traffic(
    stub: StubFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = stub()
    assert run_cli(tmp_path, "--url", server.url, "--time-scale", "2") == 2
    assert "go with --traffic" in capsys.readouterr().err


def test_two_engines_get_the_identical_schedule(stub: StubFactory, tmp_path: Path) -> None:
    one, two = stub(ttft=0.01), stub(ttft=0.03)
    args = ("--url", one.url, "--url", two.url, "--name", "one", "--name", "two")
    assert run_cli(tmp_path, *args, "--traffic", str(MOONCAKE), "--time-scale", "0.3") == 0
    lines = request_lines(tmp_path)
    by_engine = {
        name: sorted((r for r in lines if r["engine"] == name), key=lambda r: r["index"])
        for name in ("one", "two")
    }
    assert len(by_engine["one"]) == len(by_engine["two"]) == 26
    # The same prompts, word for word (the first engine also answered the two probes that
    # counted the template's tokens), and the same send times from each phase's start.
    probes = {sample_text(16), sample_text(96)}
    assert sorted(p for p in one.state.prompts if p not in probes) == sorted(two.state.prompts)
    starts = {
        n: [r["start_time"] - recs[0]["start_time"] for r in recs] for n, recs in by_engine.items()
    }
    for a, b, req in zip(
        starts["one"], starts["two"], load_traffic(str(MOONCAKE)).requests, strict=True
    ):
        if req.turn == 0:
            assert a == pytest.approx(b, abs=0.3)
    assert _summary(tmp_path)["valid"]


def test_a_closed_loop_session_thinks_before_each_later_turn(
    stub: StubFactory, tmp_path: Path
) -> None:
    """`sessions:` without `rate=` is a closed loop: each later turn still waits `think`
    (x `--time-scale`) after the answer before it, as the schedule's turns do."""
    server = stub(ttft=0.01, itl=0.001)
    spec = "sessions:sessions=2,turns=3,question=20,output=3,think=0.4"
    out = tmp_path / "out"
    args = ("--traffic", spec, "--concurrency", "2", "--time-scale", "0.5")
    assert run_cli(out, "--url", server.url, *args) == 0
    traffic = load_traffic(spec)
    assert not traffic.scheduled
    lines = {r["index"]: r for r in request_lines(out)}
    assert len(lines) == 6
    gaps = []
    for indexes in traffic.sessions().values():
        for before, after in itertools.pairwise(indexes):
            gaps.append(lines[after]["start_time"] - lines[before]["end_time"])
    assert len(gaps) == 4
    # 0.4 s of think at half time; and not much more (nothing else holds the worker).
    assert all(0.2 <= gap < 0.35 for gap in gaps), gaps
