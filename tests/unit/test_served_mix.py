"""The served mix (`served_mix`, `llmb-loadgen served-mix`) on a real Prometheus' answers.

tests/fixtures/served-mix-{sglang,llamacpp}/queries.json are the instant queries
`served_mix` asked a real Prometheus 2.42 that had scraped the real exporter over a real CPU
engine during two short `llmb-loadgen run`s, with the answers, and run.json the runs' own
lengths (`usage` of every request; README.md there says how they were made). An in-process
stand-in answers the recorded queries again (a query not recorded is an error), so these tests
check the reading and the arithmetic on real answers; tests/system/test_served_mix.py checks
the same against the live stack.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cli.loadgen import main
from core.series import ENGINE_REQUESTS_FINISHED_TOTAL, ENGINE_UP
from loadgen.prom_api import instant, label
from loadgen.served_mix import (
    MIX_KIND,
    TRAFFIC_FLAGS,
    Lengths,
    ServedMixError,
    buckets_from_cumulative,
    counted_increase,
    round_load,
    served_mix,
    window_duration,
)
from tests.conftest import get_free_port
from tests.paths import FIXTURES
from tests.plugins.engine_stubs import ThreadedApp
from tests.plugins.loadgen import sample_served_mix
from tests.plugins.prom import RecordedPrometheus

SGLANG = FIXTURES / "served-mix-sglang"
LLAMA = FIXTURES / "served-mix-llamacpp"
MIX_KEYS = {
    "kind",
    "version",
    "prompt_tokens",
    "output_tokens",
    "rate_per_second",
    "concurrency",
    "seed",
    "requests",
    "source",
}


# 2026-12-07T03:00:00Z as Unix seconds: the end of the window `--at` names.
AT = 1796612400.0


def recorded(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    answers = json.loads((folder / "queries.json").read_text(encoding="utf-8"))
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    return answers, run


def replaced(answers: list[dict[str, Any]], starts: str, result: list[Any]) -> list[dict[str, Any]]:
    """The answers with the result of every query that starts with `starts` replaced."""
    out = copy.deepcopy(answers)
    hits = [a for a in out if a["query"].startswith(starts)]
    assert hits, starts
    for a in hits:
        a["body"]["data"]["result"] = result
    return out


def finished(engine: str) -> str:
    """The query of the requests `engine` finished over the recorded 1h window."""
    sel = f"{{engine={label(engine)}}}"
    return counted_increase(ENGINE_REQUESTS_FINISHED_TOTAL + sel, "1h", ENGINE_UP + sel)


def shares(values: list[int], bounds: list[float]) -> list[float]:
    counts = [0] * len(bounds)
    for v in values:
        counts[next(i for i, ub in enumerate(bounds) if v <= ub)] += 1
    return [c / len(values) for c in counts]


# -- the arithmetic -------------------------------------------------------------------------------
def test_cumulative_buckets_become_counts_per_bucket() -> None:
    inf = float("inf")
    # increase() extrapolates each bucket alone: 6.02 then 5.99 is no request in (100, 300].
    cumulative = [(300.0, 5.99), (100.0, 6.02), (500.0, 9.0), (700.0, 9.0), (inf, 9.0)]
    buckets, above = buckets_from_cumulative(cumulative)
    assert buckets == ((100.0, 6.02), (300.0, 0.0), (500.0, pytest.approx(2.98)))
    assert above == 0.0
    # Leading empty buckets stay (a bucket starts at the bound before it); +Inf folds into
    # the last finite one.
    buckets, above = buckets_from_cumulative([(100.0, 0.0), (300.0, 4.0), (inf, 5.0)])
    assert buckets == ((100.0, 0.0), (300.0, 5.0)) and above == 1.0
    assert buckets_from_cumulative([(100.0, 0.0), (inf, 0.0)]) == ((), 0.0)


def test_the_window_is_a_duration_or_seconds() -> None:
    assert window_duration("1h30m") == "1h30m" and window_duration(3600) == "3600s"
    assert window_duration(90.4) == "90s"
    for bad in ("1 h", "0m", 0.5, float("nan")):
        with pytest.raises(ServedMixError, match="window"):
            window_duration(bad)


def test_at_takes_unix_seconds_or_rfc3339() -> None:
    assert instant("1796612400") == instant("2026-12-07T03:00:00Z") == AT
    # Without a zone it is UTC; with one, that zone.
    assert instant("2026-12-07T03:00:00") == AT == instant("2026-12-07T04:00:00+01:00")
    for bad in ("yesterday", "0", "-5", "nan", "2026-13-01T00:00:00Z"):
        with pytest.raises(argparse.ArgumentTypeError, match="time"):
            instant(bad)


def test_a_read_without_at_evaluates_every_query_at_one_instant() -> None:
    answers, run = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        before = time.time()
        mix = served_mix(prom.url, run["window"], run["engine"])
        after = time.time()
    # One instant for all queries: later scrapes cannot move the window between two of them.
    assert before <= mix.at <= after and set(prom.times) == {f"{mix.at:.3f}"}
    assert len(prom.times) == len(prom.asked) > 5
    with RecordedPrometheus(answers) as prom, pytest.raises(ServedMixError, match="--at"):
        served_mix(prom.url, run["window"], run["engine"], at=-1.0)


def test_lengths_shape_is_empirical_or_fixed_at_the_mean() -> None:
    hist = Lengths(57.3, ((100.0, 4.0), (300.0, 3.0004)), "h")
    assert hist.dist().to_obj() == {"empirical": [[100, 4.0], [300, 3.0]]}
    assert Lengths(57.5, (), "m").dist().to_obj() == {"fixed": 58}
    assert Lengths(0.2, (), "m").dist().to_obj() == {"fixed": 1}


def test_the_mix_file_has_exactly_the_contracts_fields() -> None:
    mix = sample_served_mix()
    doc = json.loads(mix.length_mix().to_json())
    assert set(doc) == MIX_KEYS
    assert (doc["kind"], doc["version"], doc["seed"], doc["requests"]) == (MIX_KIND, 1, 7, None)
    assert doc["prompt_tokens"] == {"empirical": [[100, 4.0], [300, 3.0]]}
    assert doc["output_tokens"] == {"fixed": 30}
    assert doc["rate_per_second"] == 7 / 3600 and doc["concurrency"] == 2.0
    assert "25.0% of prompt tokens cached" in doc["source"] and "lacks: x" in doc["source"]
    assert round_load(1.2) == mix.concurrency == 2


# -- real answers: SGLang -------------------------------------------------------------------------
def test_sglang_mix_from_real_answers_is_the_runs_lengths() -> None:
    answers, run = recorded(SGLANG)
    lengths = run["lengths"]
    with RecordedPrometheus(answers) as prom:
        mix = served_mix(prom.url, run["window"], run["engine"])
    assert (mix.engine, mix.kind, mix.window) == (run["engine"], "sglang", run["window"])
    # Counted from the samples, not extrapolated: the run's exact count, means and shares.
    assert mix.requests == len(lengths)
    assert mix.rate_per_second == pytest.approx(len(lengths) / 3600)
    for got, column in ((mix.prompt, 0), (mix.output, 1)):
        values = [pair[column] for pair in lengths]
        assert got.mean == pytest.approx(statistics.fmean(values), rel=1e-9)
        total = sum(w for _, w in got.buckets)
        assert total == len(values)
        want = shares(values, [ub for ub, _ in got.buckets])
        assert [w / total for _, w in got.buckets] == pytest.approx(want, abs=1e-9)
    assert [ub for ub, _ in mix.prompt.buckets] == [100.0, 300.0]
    assert [ub for ub, _ in mix.output.buckets] == [100.0, 300.0]
    assert mix.running_p50 is not None and mix.running_p90 is not None
    assert 0 <= mix.running_p50 <= mix.running_p90 <= 2
    assert not any("mean length" in item for item in mix.lacks)


def test_served_mix_command_writes_the_file_and_the_summary(tmp_path: Path, capsys: Any) -> None:
    answers, run = recorded(SGLANG)
    out = tmp_path / "mix.json"
    with RecordedPrometheus(answers) as prom:
        args = ["served-mix", "--prometheus", prom.url, "--window", run["window"]]
        args += ["--at", "2026-12-07T03:00:00Z"]
        assert main([*args, "--engine", run["engine"], "--out", str(out), "--seed", "9"]) == 0
        printed = capsys.readouterr().out
        mix = served_mix(prom.url, run["window"], run["engine"], seed=9, at=AT)
        # Without --out: the JSON on stdout, the summary on stderr.
        assert main([*args, "--engine", run["engine"], "--seed", "9"]) == 0
        piped = capsys.readouterr()
        # Every query of the three reads at the one instant (as Prometheus takes it).
        assert set(prom.times) == {f"{AT:.3f}"} and len(prom.times) == len(prom.asked)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc == json.loads(mix.length_mix().to_json()) == json.loads(piped.out)
    assert set(doc) == MIX_KEYS and doc["seed"] == 9
    assert "empirical" in doc["prompt_tokens"] and "empirical" in doc["output_tokens"]
    ends = "ending 2026-12-07T03:00:00Z"
    want = f"served mix of {run['engine']} (sglang) over the {run['window']} {ends}"
    assert want in printed and "over the 1h ending 2026-12-07T03:00:00Z," in doc["source"]
    assert f"wrote {out}" in printed and "lacks   no arrival times" in printed
    assert "served mix of" in piped.err


# -- real answers: llama.cpp ----------------------------------------------------------------------
def test_llamacpp_mix_from_real_answers_is_the_mean_and_says_so() -> None:
    answers, run = recorded(LLAMA)
    lengths = run["lengths"]
    with RecordedPrometheus(answers) as prom:
        mix = served_mix(prom.url, run["window"], run["engine"])
    assert mix.kind == "llamacpp"
    for got, column in ((mix.prompt, 0), (mix.output, 1)):
        mean = statistics.fmean(pair[column] for pair in lengths)
        assert got.mean == pytest.approx(mean, rel=1e-9)
        assert got.buckets == () and got.dist().to_obj() == {"fixed": round(got.mean)}
    assert mix.lacks[0] == (
        "llama.cpp exports only token totals, no per-request length histograms "
        "(llmb_engine_request_prompt_tokens, llmb_engine_request_generation_tokens): the mix "
        "is the mean length"
    )
    assert "llama.cpp exports only token totals" in mix.prompt.source
    assert mix.requests == len(lengths)


def test_llamacpp_without_its_log_has_no_request_count(capsys: Any) -> None:
    answers, run = recorded(LLAMA)
    answers = replaced(answers, finished(run["engine"]), [])
    with RecordedPrometheus(answers) as prom:
        code = main(["served-mix", "--prometheus", prom.url, "--engine", run["engine"]])
    err = capsys.readouterr().err
    assert code == 2
    assert "counts tokens but not requests" in err and "log_file" in err


# -- errors: one message, exit 2 ------------------------------------------------------------------
def test_an_engine_prometheus_has_not_is_named_with_those_it_has(capsys: Any) -> None:
    answers, run = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        code = main(["served-mix", "--prometheus", prom.url, "--engine", "nope"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"no samples of engine 'nope' in the last 1h; it has samples of {run['engine']}" in err


def test_several_engines_need_engine(capsys: Any) -> None:
    answers, _ = recorded(SGLANG)
    up = next(a for a in answers if a["query"].startswith("count by (engine, kind)"))
    two = up["body"]["data"]["result"] + [
        {"metric": {"engine": "llama", "kind": "llamacpp"}, "value": [0, "30"]}
    ]
    with RecordedPrometheus(replaced(answers, "count by (engine, kind)", two)) as prom:
        with pytest.raises(ServedMixError, match=r"several engines \(llama, sgl\): pass --engine"):
            served_mix(prom.url, "1h")
        with pytest.raises(ServedMixError, match=r"\(llama, sgl\): pass --traffic-engine NAME$"):
            served_mix(prom.url, "1h", flags=TRAFFIC_FLAGS)


def test_no_exporter_samples_asks_whether_it_scrapes_the_exporter() -> None:
    answers, _ = recorded(SGLANG)
    with RecordedPrometheus(replaced(answers, "count by (engine, kind)", [])) as prom:
        with pytest.raises(ServedMixError, match="is it scraping the exporter"):
            served_mix(prom.url, "1h")


def test_a_window_without_finished_requests_says_so() -> None:
    answers, run = recorded(SGLANG)
    zero = [{"metric": {}, "value": [0, "0"]}]
    with RecordedPrometheus(replaced(answers, finished(run["engine"]), zero)) as prom:
        with pytest.raises(ServedMixError, match="finished no request in the last 1h"):
            served_mix(prom.url, "1h", run["engine"])


def test_a_window_prometheus_was_not_asked_for_is_its_error() -> None:
    answers, run = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        with pytest.raises(ServedMixError, match=r"did not answer .* \(HTTP 400: not recorded"):
            served_mix(prom.url, "2h", run["engine"])


class NotPrometheus(ThreadedApp):
    async def handle(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="llmb_engine_up 1\n", status=404)


def test_unreachable_or_not_prometheus_is_one_message(capsys: Any) -> None:
    url = f"http://127.0.0.1:{get_free_port()}"
    assert main(["served-mix", "--prometheus", url]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach Prometheus at {url}" in err and "Traceback" not in err
    with NotPrometheus() as page:
        assert main(["served-mix", "--prometheus", f"http://127.0.0.1:{page.port}"]) == 2
    assert "without Prometheus' JSON: give Prometheus' base URL" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prometheus", "localhost:9090"], "must start with http:// or https://"),
        (["--prometheus", "http://p:9090", "--window", "1 h"], "Prometheus duration"),
        (["--prometheus", "http://p:9090", "--window", "0m"], "Prometheus duration"),
        ([], "served-mix: give --prometheus URL"),
    ],
)
def test_bad_flags_exit_2(flags: list[str], message: str, capsys: Any) -> None:
    assert main(["served-mix", *flags]) == 2
    assert message in capsys.readouterr().err


def test_an_unwritable_out_is_one_message(tmp_path: Path, capsys: Any) -> None:
    answers, run = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        code = main(["served-mix", "--prometheus", prom.url, "--engine", run["engine"],
                     "--out", str(tmp_path / "missing" / "mix.json")])  # fmt: skip
    assert code == 2 and "--out " in capsys.readouterr().err


def test_out_may_be_a_folder_and_engine_is_given_once(tmp_path: Path, capsys: Any) -> None:
    answers, run = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        args = ["served-mix", "--prometheus", prom.url, "--engine", run["engine"]]
        assert main([*args, "--out", str(tmp_path)]) == 0
        assert main([*args, "--engine", "llama"]) == 2
    doc = json.loads((tmp_path / "served-mix.json").read_text(encoding="utf-8"))
    assert doc["kind"] == MIX_KIND
    assert "reads one engine: give --engine once" in capsys.readouterr().err


def test_the_config_file_gives_prometheus_and_at(tmp_path: Path, capsys: Any) -> None:
    """`--config`'s `loadgen:` keys are served-mix's defaults (the Prometheus too, which
    argparse's `required` would have refused from a file); a file that cannot be read, or no
    Prometheus at all, is one message and exit 2."""
    answers, run = recorded(SGLANG)
    with RecordedPrometheus(answers) as prom:
        config = tmp_path / "config.yaml"
        config.write_text(
            f"loadgen:\n  prometheus: {prom.url}\n  at: '2026-12-07T03:00:00Z'\n"
            f"  engine: [{run['engine']}]\n  window: {run['window']}\n",
            encoding="utf-8",
        )
        assert main(["served-mix", "--config", str(config)]) == 0
        assert set(prom.times) == {f"{AT:.3f}"}
    assert "ending 2026-12-07T03:00:00Z" in capsys.readouterr().err
    assert main(["served-mix", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read" in capsys.readouterr().err
    assert main(["served-mix"]) == 2
    assert "served-mix: give --prometheus URL" in capsys.readouterr().err
