"""The user's load from Prometheus (`--load-from`): the query, its answer, the rounding, the
precedence of `--load`, and one clear message (exit 2, nothing measured) for each failure.

Prometheus here is an in-process stand-in of its query API (`/api/v1/query`) that answers
the instant-vector JSON Prometheus answers; `tests/system/test_load_from_prometheus.py`
asks a real Prometheus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cli.loadgen import main
from diagnose.served_load import (
    LoadQuery,
    p90_query,
    prom_duration,
    round_load,
    user_load,
)
from loadgen.prom_api import QueryError, vector_values
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.engine_stubs import ThreadedApp
from tests.plugins.prom import QueryAnswers

SAME = ROOT / "docs" / "results" / "h200-sglang-vs-llamacpp-2026-12-01" / "same-weights"


def vector(*series: tuple[dict[str, str], str]) -> dict[str, Any]:
    result = [{"metric": labels, "value": [time.time(), value]} for labels, value in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class FakePrometheus(QueryAnswers):
    """`/api/v1/query`: each query answered by the first of `answers` whose key it starts with
    (an empty vector when none); `asked` keeps the queries asked."""

    def __init__(self, answers: dict[str, tuple[int, dict[str, Any]]]) -> None:
        super().__init__()
        self.answers = answers

    def answer(self, query: str) -> tuple[int, Any]:
        return next(
            (a for key, a in self.answers.items() if query.startswith(key)), (200, vector())
        )


class RunningPage(ThreadedApp):
    """Not Prometheus: an exporter's page at every path."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text='llmb_engine_requests_running{engine="llama"} 3\n', status=404)


def p90_of(value: str, count: str = "720", engine: str = "llama") -> FakePrometheus:
    labels = {"engine": engine, "kind": "llamacpp", "instance": "gpu1:9490"}
    return FakePrometheus(
        {
            "quantile_over_time": (200, vector((labels, value))),
            "count_over_time": (200, vector((labels, count))),
        }
    )


def decide(tmp_path: Path, *flags: str) -> tuple[int, dict[str, Any] | None]:
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"  # a new one each call
    code = main(["decide", str(SAME), "--in-use", "llama", *flags, "--out", str(out)])
    doc = None
    if (out / "results.json").is_file():
        doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return code, doc


@pytest.mark.parametrize(
    ("p90", "load"),
    [(12.0, 12), (11.3, 12), (12.0000000001, 12), (0.0, 1), (0.4, 1), (63.9, 64)],
)
def test_the_p90_rounds_up_to_whole_requests(p90: float, load: int) -> None:
    assert round_load(p90) == load


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_p90_that_is_no_number_of_requests_is_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        round_load(bad)


@pytest.mark.parametrize("ok", ["1h", "30m", "1h30m", "90s", "7d", "500ms"])
def test_windows_are_prometheus_durations(ok: str) -> None:
    assert prom_duration(ok) == ok


@pytest.mark.parametrize("bad", ["", "1", "h", "0h", "1 h", "1hx", "-1h", "1.5h"])
def test_a_window_that_is_no_duration_is_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="Prometheus duration"):
        prom_duration(bad)


def test_the_query_selects_the_engine_label_quoted() -> None:
    assert p90_query("llama", "1h") == (
        'quantile_over_time(0.9, llmb_engine_requests_running{engine="llama"}[1h])'
    )
    assert 'engine="a\\"b\\\\c"' in p90_query('a"b\\c', "5m")


def test_vector_values_reads_labels_and_numbers() -> None:
    body = vector(({"engine": "a"}, "3.5"), ({"engine": "b"}, "NaN"))
    values = vector_values(body)
    assert values[0] == ({"engine": "a"}, 3.5) and values[1][0] == {"engine": "b"}
    with pytest.raises(ValueError, match="parse error"):
        vector_values({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(ValueError, match="instant vector"):
        vector_values({"status": "success", "data": {"resultType": "matrix", "result": []}})
    with pytest.raises(QueryError, match="not a sample"):
        vector_values({"status": "success", "data": {"resultType": "vector", "result": [{}]}})


def test_load_given_wins_and_prometheus_is_not_asked() -> None:
    with p90_of("63.2") as prom:
        served = user_load(4, LoadQuery(prom.url), "llama")
        assert served is not None and (served.concurrency, served.source) == (4, "--load")
        assert prom.asked == []
    assert user_load(None, None, "llama") is None


def test_the_busiest_series_of_the_engine_is_its_load() -> None:
    a = {"engine": "llama", "instance": "gpu1:9490"}
    b = {"engine": "llama", "instance": "gpu2:9490"}
    prom = FakePrometheus(
        {
            "quantile_over_time": (200, vector((a, "3"), (b, "11.2"))),
            "count_over_time": (200, vector((a, "700"), (b, "719"))),
        }
    )
    with prom:
        served = LoadQuery(prom.url, "30m").read("llama")
    assert served.concurrency == 12
    assert served.source == (
        "the p90 of running requests over the last 30m on llama (11.2 over 719 samples, the "
        f"busiest of 2 series; Prometheus at {prom.url})"
    )
    assert prom.asked[0] == p90_query("llama", "30m")


def test_decide_reads_the_load_of_the_engine_in_use(tmp_path: Path, capsys: Any) -> None:
    with p90_of("63.2") as prom:
        code, doc = decide(tmp_path, "--load-from", prom.url)
    assert code == 0 and doc is not None
    assert doc["recommendation"] == "switch_to:sglang"
    assert doc["decision"]["load"] == 64
    source = doc["decision"]["load_source"]
    assert source.startswith("the p90 of running requests over the last 1h on llama (63.2 ")
    out = capsys.readouterr().out
    assert f"your load       c=64, {source}" in out
    assert f"**Your load:** c=64, {source}" in (tmp_path / "out0" / "report.md").read_text()
    assert 'id="load"' in (tmp_path / "out0" / "report.html").read_text()


def test_decide_with_load_and_load_from_uses_load(tmp_path: Path, capsys: Any) -> None:
    with p90_of("63.2") as prom:
        code, doc = decide(tmp_path, "--load", "1", "--load-from", prom.url)
        assert prom.asked == []
    assert code == 0 and doc is not None
    assert doc["recommendation"] == "stay"
    assert (doc["decision"]["load"], doc["decision"]["load_source"]) == (1, "--load")
    assert "your load       c=1, --load" in capsys.readouterr().out


def test_unreachable_prometheus_is_one_message(tmp_path: Path, capsys: Any) -> None:
    url = f"http://127.0.0.1:{get_free_port()}"
    code, doc = decide(tmp_path, "--load-from", url)
    err = capsys.readouterr().err
    assert code == 2 and doc is None
    assert f"cannot reach Prometheus at {url}" in err and "Traceback" not in err


def test_no_samples_of_the_engine_names_those_it_has(tmp_path: Path, capsys: Any) -> None:
    others = vector(({"engine": "prod-llama"}, "720"), ({"engine": "sglang"}, "12"))
    with FakePrometheus({"count by (engine)": (200, others)}) as prom:
        code, _ = decide(tmp_path, "--load-from", prom.url, "--load-window", "2h")
    err = capsys.readouterr().err
    assert code == 2
    assert "no llmb_engine_requests_running samples of engine 'llama' in the last 2h" in err
    assert "it has samples of prod-llama, sglang: pass --load-engine NAME" in err


def test_an_empty_prometheus_asks_whether_it_scrapes_the_exporter(
    tmp_path: Path, capsys: Any
) -> None:
    with FakePrometheus({}) as prom:
        code, _ = decide(tmp_path, "--load-from", prom.url)
    assert code == 2
    assert "is it scraping the exporter (job llmb-exporter)?" in capsys.readouterr().err


def test_a_failed_query_says_what_prometheus_said(tmp_path: Path, capsys: Any) -> None:
    error = {"status": "error", "errorType": "bad_data", "error": "out of bounds"}
    with FakePrometheus({"quantile_over_time": (400, error)}) as prom:
        code, _ = decide(tmp_path, "--load-from", prom.url)
    err = capsys.readouterr().err
    assert code == 2 and "(HTTP 400: out of bounds)" in err


def test_a_url_that_is_not_prometheus_says_so(tmp_path: Path, capsys: Any) -> None:
    with RunningPage() as page:
        code, _ = decide(tmp_path, "--load-from", f"http://127.0.0.1:{page.port}")
    assert code == 2 and "without Prometheus' JSON: give Prometheus' base URL" in (
        capsys.readouterr().err
    )


def test_load_engine_picks_the_series_and_needs_load_from(tmp_path: Path, capsys: Any) -> None:
    with p90_of("1", engine="prod-llama") as prom:
        code, doc = decide(tmp_path, "--load-from", prom.url, "--load-engine", "prod-llama")
        assert 'engine="prod-llama"' in prom.asked[0]
    assert code == 0 and doc is not None and doc["recommendation"] == "stay"
    code, _ = decide(tmp_path, "--load-engine", "prod-llama")
    assert code == 2 and "give both" in capsys.readouterr().err


async def test_compare_asks_prometheus_before_measuring(
    tmp_path: Path, capsys: Any, serve: Any
) -> None:
    # Engines that answer the probe and nothing else: a measurement fails with exit 1 (no
    # /tokenize); the load query fails first, with exit 2 and nothing written.
    out = tmp_path / "cmp"
    probe = {"/v1/models": {"data": [{"id": "m"}]}, "/props": {"total_slots": 1}}
    urls = [(await serve(probe))[0] for _ in range(2)]

    async def compare(prom: FakePrometheus) -> int:
        args = ["compare", "--url", urls[0], "--url", urls[1], "--kind", "llamacpp"]
        args += ["--name", "llama", "--name", "sglang", "--out", str(out)]
        args += ["--concurrency", "1", "--host-bandwidth-gbs", "50"]
        return await asyncio.to_thread(main, [*args, "--load-from", prom.url])

    with FakePrometheus({}) as prom:
        assert await compare(prom) == 2
    assert "no llmb_engine_requests_running samples of engine 'llama'" in capsys.readouterr().err
    assert not (out / "results.json").exists()
    with p90_of("7") as prom:
        assert await compare(prom) == 1
    assert "your load: c=7, the p90 of running requests over the last 1h on llama" in (
        capsys.readouterr().err
    )
