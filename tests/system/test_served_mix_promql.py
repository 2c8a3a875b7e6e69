"""The served mix's counter increase (`loadgen.served_mix.counted_increase`) in the real
Prometheus engine: promtool evaluates the expression on input series of each case, and the
answer must be the requests the series counted, where `increase()` extrapolates.

Cases (one sample a minute, window 1h): a counter older than the window (last less the value
at the window's start); a histogram series that appears with its first requests while the
exporter is scraped (counts from zero: `increase()` reads 3.6 of 4 requests there, and the mean
of its `_sum` over its `_count` moves); a Prometheus started inside the window (what it saw,
max - min); a counter that resets (falls back to `increase()`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.series import ENGINE_UP
from loadgen.served_mix import counted_increase

pytestmark = pytest.mark.prometheus

ENGINE = '{engine="a"}'
UP_SEL = f"{ENGINE_UP}{ENGINE}"


def expr(name: str, by: str = "") -> str:
    return counted_increase(f"{name}{ENGINE}", "1h", UP_SEL, by)


def promtool(tmp_path: Path, series: dict[str, str], tests: list[dict[str, Any]]) -> str:
    """promtool's verdict on `tests` (expr, eval_time, exp_samples) over `series`."""
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "counted-test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


def case(query: str, at: str, value: float, labels: str = "{}") -> dict[str, Any]:
    return {"expr": query, "eval_time": at, "exp_samples": [{"labels": labels, "value": value}]}


def test_a_counter_older_than_the_window_is_its_last_less_its_start(tmp_path: Path) -> None:
    series = {f'{ENGINE_UP}{{engine="a",kind="sglang"}}': "1x80", f"c{ENGINE}": "2+1x80"}
    # At 70m the value is 72, at 10m (the window's start) 12.
    out = promtool(tmp_path, series, [case(expr("c"), "70m", 60)])
    assert "SUCCESS" in out, out


def test_a_series_that_appears_in_the_window_counts_from_zero(tmp_path: Path) -> None:
    # SGLang's histograms appear with the first request: one request of 69 tokens is in the
    # first sample, then three of 232.
    series = {
        f'{ENGINE_UP}{{engine="a",kind="sglang"}}': "1x70",
        f"p_count{ENGINE}": "_x30 1 1 4 4 4 4",
        f"p_sum{ENGINE}": "_x30 69 69 765 765 765 765",
        'p_bucket{engine="a",le="100"}': "_x30 1 1 1 1 1 1",
        'p_bucket{engine="a",le="300"}': "_x30 1 1 4 4 4 4",
    }
    exact = [
        case(expr("p_count"), "40m", 4),
        case(expr("p_sum"), "40m", 765),
        case(f"{expr('p_sum')} / {expr('p_count')}", "40m", 765 / 4),
        {
            "expr": expr("p_bucket", " by (le)"),
            "eval_time": "40m",
            "exp_samples": [
                {"labels": '{le="100"}', "value": 1},
                {"labels": '{le="300"}', "value": 4},
            ],
        },
    ]
    assert "SUCCESS" in promtool(tmp_path, series, exact)
    # increase() on the same samples is not the count: that is why the mix does not use it.
    out = promtool(tmp_path, series, [case(f"sum(increase(p_count{ENGINE}[1h]))", "40m", 4)])
    assert "FAILED" in out and "got: {} 3.59" in out, out


def test_a_prometheus_started_in_the_window_counts_what_it_saw(tmp_path: Path) -> None:
    # The exporter and the engine's counter were there before Prometheus' first scrape.
    series = {
        f'{ENGINE_UP}{{engine="a",kind="sglang"}}': "_x30 1x10",
        f"c{ENGINE}": "_x30 100 101 105x8",
    }
    out = promtool(tmp_path, series, [case(expr("c"), "40m", 5)])
    assert "SUCCESS" in out, out


def test_a_counter_that_reset_is_increase(tmp_path: Path) -> None:
    series = {f'{ENGINE_UP}{{engine="a",kind="sglang"}}': "1x80", f"c{ENGINE}": "0+1x40 0+1x39"}
    check = f"({expr('c')}) - sum(increase(c{ENGINE}[1h]))"
    out = promtool(tmp_path, series, [case(check, "80m", 0)])
    assert "SUCCESS" in out, out
