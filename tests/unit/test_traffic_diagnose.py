"""`diagnose --traffic` / `compare --traffic`: the flags as `run` parses them, their errors
before any engine is asked, the per-request token check and the mix in results.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from cli.loadgen import build_parser, default_commands, main
from diagnose.cli import options_from_args
from diagnose.decision.model import Decision, EngineResult, Facts, Row
from diagnose.decision.results import engine_from_dict, results_to_dict
from diagnose.engine_run import EngineRun
from diagnose.load import EngineTiming, _add_round, _Rounds, _summarize, traffic_off
from diagnose.options import add_traffic
from diagnose.report.content import traffic_rows
from diagnose.steps.concurrency import traffic_text
from loadgen.results import RequestRecord
from loadgen.summary import summarize
from loadgen.traffic.spec import load_traffic, served_traffic
from loadgen.traffic.summary import histogram, traffic_mix
from loadgen.traffic.traces import read_mooncake
from tests.plugins.prom import RecordedPrometheus
from tests.unit.test_served_mix import SGLANG, recorded

# Port 1 refuses connections: a command that got as far as the engine would exit 1, not 2.
DEAD = "http://127.0.0.1:1"
MIX = "mix:prompt=uniform:100:300,output=fixed:16,rate=4,n=20,seed=3"


def trace(tmp_path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 700, "output_length": 9, "hash_ids": [1, 3]},
        {"timestamp": 1000, "input_length": 40, "output_length": 3, "hash_ids": [4]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("command", ["diagnose", "compare"])
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--traffic", MIX, "--traffic-from", "http://p:9090"], "not both"),
        (["--no-schedule"], "--time-scale and --no-schedule go with --traffic"),
        (["--time-scale", "0.5"], "--time-scale and --no-schedule go with --traffic"),
        (["--traffic", MIX, "--traffic-engine", "x"], "--traffic-engine goes with --traffic-from"),
        (["--traffic", "mix:prompt=fixed:10"], "--traffic: --traffic mix: output= is required"),
        (["--traffic", "nowhere.jsonl"], "--traffic: --traffic nowhere.jsonl: cannot read it"),
        (["--traffic", MIX, "--slo", "e2e_p50=1s", "--find-max"], "drop --find-max or --traffic"),
    ],
)
def test_contradicting_or_bad_traffic_flags_exit_2_before_any_engine(
    command: str, flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    urls = ["--url", DEAD] * (2 if command == "compare" else 1)
    code = main([command, *urls, "--out", str(tmp_path / "o"), *flags])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_flags_give_the_traffic_and_its_width(tmp_path: Path) -> None:
    parser = build_parser(default_commands())
    args = parser.parse_args(["diagnose", "--url", DEAD, "--out", "o", "--concurrency", "2,6",
                              "--traffic", str(trace(tmp_path)), "--time-scale", "0.25",
                              "--no-schedule"])  # fmt: skip
    opts = options_from_args(args, None)
    add_traffic(args, opts)
    assert opts.traffic is not None and len(opts.traffic.requests) == 3
    assert (opts.time_scale, opts.schedule) == (0.25, False)
    # The highest --concurrency; a mix's own closed-loop width wins over it.
    assert opts.traffic_width() == 6
    closed = "mix:prompt=fixed:64,output=fixed:8,concurrency=3"
    args = parser.parse_args(["compare", "--url", DEAD, "--url", DEAD, "--out", "o",
                              "--traffic", closed])  # fmt: skip
    opts = options_from_args(args, None)
    add_traffic(args, opts)
    assert opts.traffic is not None and opts.traffic_width() == 3
    # A mix without n= draws loadgen's default request count.
    assert len(opts.traffic.requests) == 32 and opts.schedule is True
    # No traffic flag: the fixed prompts, unchanged.
    args = parser.parse_args(["diagnose", "--url", DEAD, "--out", "o"])
    opts = options_from_args(args, None)
    add_traffic(args, opts)
    assert opts.traffic is None and opts.prompt_tokens == 128


def record(index: int, prompt: int, target: int, completion: int, error: str | None = None):
    return RequestRecord(
        "e", 0, index, 0.0, 1.0, 0.1, None, None, None, None, 1.0, None, prompt, completion,
        None, completion, "length", None, None, None, None, None, None, error,
        prompt_tokens_target=target,
    )  # fmt: skip


def test_each_request_is_checked_against_the_lengths_the_trace_asked(tmp_path: Path) -> None:
    traffic = load_traffic(str(trace(tmp_path)))
    good = [record(0, 600, 600, 5), record(1, 701, 700, 9), record(2, 40, 40, 3)]
    # A chat template's merged token is within the tolerance; the lengths all differ, so a
    # single max_tokens could not have checked them.
    assert traffic_off(traffic, good) == 0
    bad = [
        record(0, 600, 600, 4, "early_stop"),  # cut short
        record(1, 703, 700, 9),  # the prompt 3 tokens off
        record(2, 40, 40, 5),  # more output than asked
    ]
    assert traffic_off(traffic, bad) == 3
    # A failed request is a failure, not a length mismatch.
    assert traffic_off(traffic, [record(0, 600, 600, 0, "timeout")]) == 0


def test_late_sends_are_counted_in_the_row_and_said_beside_the_ttft() -> None:
    """A scheduled replay held at the cap on requests in flight: the sends it could not keep
    are counted over the rounds (never shifted) and the answer says their wait is in no TTFT
    (a review's case: 32 of 40 late, p99 6.4 s, TTFT p99 0.05 s)."""

    def round_of(errors: list[float]):
        recs = [
            dataclasses.replace(record(i, 40, 40, 3), send_error_s=e) for i, e in enumerate(errors)
        ]
        return summarize(recs, engine="e", step=0, concurrency=4, rate=None,
                         prompt_tokens_target=None, max_tokens=3, wall_s=1.0)  # fmt: skip

    def row_of(acc: _Rounds) -> Row:
        """The step's row as diagnose makes it once its rounds have run."""
        run = SimpleNamespace(opts=SimpleNamespace(max_tokens=3), facts=Facts("e", "llamacpp"))
        return _summarize(cast(EngineRun, run), Row("e", "concurrency", 4), acc, EngineTiming())

    acc = _Rounds(requests=8, traffic=True)  # the rounds count requests as they run
    _add_round(acc, round_of([0.001, 0.002, 0.5, 6.4]))
    _add_round(acc, round_of([0.001, 0.004, 0.003, 0.2]))
    row = row_of(acc)
    # More than 5 ms after the trace's time: 2 + 1; the worst round's p99.
    assert row.late_sends == 3
    assert row.send_error_p99_s == pytest.approx(
        round_of([0.001, 0.002, 0.5, 6.4]).send_error_p99_s
    )
    assert row.tokens_ok
    text = traffic_text(row)
    assert "; 3 of 8 requests sent later than the trace's times (4 in flight at most, p99" in text
    assert "raise --concurrency" in text
    # On time: nothing said; without a schedule: nothing measured.
    on_time = _Rounds(requests=4, traffic=True)
    _add_round(on_time, round_of([0.001, 0.002, 0.004, 0.0]))
    on_time_row = row_of(on_time)
    assert on_time_row.late_sends == 0 and "sent later" not in traffic_text(on_time_row)
    unscheduled = _Rounds(requests=4)
    _add_round(unscheduled, round_of([]))
    bare = row_of(unscheduled)
    assert bare.late_sends is None and bare.send_error_p99_s is None


def test_the_mix_is_in_results_json_and_read_back(tmp_path: Path) -> None:
    traffic = load_traffic(str(trace(tmp_path)))
    mix = traffic_mix(traffic, time_scale=0.5, schedule=True, width=4)
    assert mix.requests == 3 and mix.scheduled and mix.concurrency == 4
    # Two gaps over one second of trace, replayed twice as fast.
    assert mix.rate_per_s == pytest.approx(4.0)
    # Block 1 (512 tokens) is sent twice: the second time it is shared.
    assert mix.shared_prefix_share == pytest.approx(512 / 1340)
    assert mix.prompt_tokens.histogram == [(64, 1), (1024, 2)]
    assert (mix.output_tokens.min, mix.output_tokens.max) == (3.0, 9.0)
    row = Row("e", "concurrency", 4, prompt_cache_hit_ratio=0.38, tokens_off=0)
    engine = EngineResult("e", "llamacpp", rows=[row], traffic=mix)
    doc = results_to_dict([engine], doc_decision())
    text = json.loads(json.dumps(doc))
    assert text["engines"][0]["traffic"]["prompt_tokens"]["p50"] == 600.0
    assert text["engines"][0]["rows"][0]["prompt_cache_hit_ratio"] == 0.38
    back = engine_from_dict(text["engines"][0])
    assert back.traffic == mix and back.rows == [row]
    # Without --traffic the field is null and reads back as None.
    plain = dataclasses.replace(engine, traffic=None)
    assert engine_from_dict(results_to_dict([plain], doc_decision())["engines"][0]).traffic is None
    rows = dict(traffic_rows([engine, engine]))
    assert rows["shared prefix"] == "38.2% of prompt tokens"
    assert rows["prompt histogram"] == "≤64: 1, ≤1024: 2"
    assert rows["arrival rate"] == "4 requests/s (time scale 0.5)"
    assert traffic_rows([plain]) == []


def test_a_session_arrives_once_in_the_rate() -> None:
    """The rate counts each session once, at its first turn: its later turns come when the
    answers do, not at the session's start (20 turns of 4 sessions read 4.6 requests/s)."""
    spec = "sessions:sessions=4,turns=5,question=50,output=20,think=2,rate=0.5"
    traffic = load_traffic(spec)
    starts = sorted(r.at_s for r in traffic.requests if r.turn == 0)
    mix = traffic_mix(traffic, time_scale=1.0, schedule=True, width=8)
    assert (mix.requests, mix.sessions, mix.arrivals) == (20, 4, 4)
    assert mix.rate_per_s == pytest.approx(3 / (starts[-1] - starts[0]))
    assert "sessions/s" in mix.text() and "requests/s" not in mix.text()
    assert (
        dict(traffic_rows([EngineResult("e", "llamacpp", traffic=mix)]))["arrival rate"]
        == f"{mix.rate_per_s:.3g} sessions/s (time scale 1)"
    )
    # Single requests and sessions: arrivals, each session once.
    rows = [
        {"timestamp": 0, "input_length": 10, "output_length": 2},
        {"session_id": "a", "timestamp": 500, "input_length": 10, "output_length": 2},
        {"session_id": "a", "delay": 100, "input_length": 30, "output_length": 2},
        {"timestamp": 1000, "input_length": 10, "output_length": 2},
    ]
    both = read_mooncake("".join(json.dumps(r) + "\n" for r in rows), "t.jsonl")
    assert both.describe()["rate_per_s"] == pytest.approx(2.0)
    assert both.describe()["arrivals"] == 3
    assert "2 arrivals/s" in traffic_mix(both, 1.0, True, 4).text()
    # Without sessions nothing changes: requests per second.
    plain = read_mooncake(
        "".join(json.dumps({**r, "session_id": None}) + "\n" for r in rows[:2]), "p.jsonl"
    )
    assert plain.describe()["rate_per_s"] == pytest.approx(2.0)


def doc_decision() -> Decision:
    return Decision({"e": "idle"}, "inconclusive", "", True, [])


def test_histogram_buckets_are_powers_of_two() -> None:
    assert histogram([1, 2, 3, 4, 5, 512, 513]) == [
        (1, 1),
        (2, 1),
        (4, 2),
        (8, 1),
        (512, 1),
        (1024, 1),
    ]


def test_traffic_from_is_the_served_mix_as_run_reads_it() -> None:
    answers, run = recorded(SGLANG)
    parser = build_parser(default_commands())
    with RecordedPrometheus(answers) as prom:
        args = parser.parse_args(["diagnose", "--url", DEAD, "--out", "o",
                                  "--traffic-from", prom.url, "--traffic-window", run["window"],
                                  "--traffic-engine", run["engine"]])  # fmt: skip
        opts = options_from_args(args, None)
        add_traffic(args, opts)
        want = served_traffic(prom.url, run["window"], run["engine"], 32)
    assert opts.traffic is not None
    assert opts.traffic.source.startswith(f"served mix of {run['engine']} over the last 1h")
    # The same requests `run --traffic-from` replays: one reader, one draw.
    assert opts.traffic.requests == want.requests and len(want.requests) == 32
