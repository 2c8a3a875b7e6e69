"""The served mix's counter increase (`loadgen.served_mix.counted_increase`) in the real
Prometheus engine: promtool evaluates the expression on input series of each case, and the
answer must be the requests the series counted, where `increase()` extrapolates.

Cases (one sample a minute, window 1h): a counter older than the window (last less the value
at the window's start); a histogram series that appears with its first requests while the
exporter is scraped (counts from zero: `increase()` reads 3.6 of 4 requests there, and the mean
of its `_sum` over its `_count` moves); a Prometheus started inside the window (what it saw,
max - min); a counter that resets (falls back to `increase()`).

And what a failed engine scrape does (the exporter then answers only `llmb_engine_up 0`, so the
engine's counters get a stale marker): at the window's start and inside it, a long-lived
counter is still its last less its last value before the window (the old query counted its
whole life); with Prometheus started inside the window, still what it saw; an instance first
scraped mid-window is judged by its own `up`, not another's; a restart between the last sample
before the window and the first in it counts from zero (the old query gave a negative count);
a series new since the hour before counts from zero.
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


def up_with(values: str, instance: str = "x") -> dict[str, str]:
    return {f'{ENGINE_UP}{{engine="a",kind="sglang",instance="{instance}"}}': values}


def test_failed_engine_scrapes_leave_a_counter_its_start(tmp_path: Path) -> None:
    # The engine's /metrics failed at 10m (the window's start) and at 41m: the exporter
    # answered only `llmb_engine_up 0`, so the counter has a stale marker there. Its value
    # before the window is the 11 at 9m; an instant `offset` lookup stops at the marker and
    # the old query took the series as new in the window and counted all of its 72.
    series = {
        **up_with("1x9 0 1x29 0 1x28"),
        'c{engine="a",instance="x"}': "2+1x9 stale 13+1x29 stale 44+1x28",
    }
    out = promtool(tmp_path, series, [case(expr("c"), "70m", 72 - 11)])
    assert "SUCCESS" in out, out


def test_a_prometheus_started_in_the_window_with_a_failed_scrape(tmp_path: Path) -> None:
    # Prometheus' first scrape at 30m; the engine's /metrics failed at 35m (up 0, the counter
    # stale): the counter that was at 100 before Prometheus counts what it saw, 110 - 100, not
    # its 110; the histogram that appeared with its first request at 32m counts from zero.
    series = {
        **up_with("_x30 1x4 0 1x4"),
        'c{engine="a",instance="x"}': "_x30 100 101 102 103 104 stale 106 107 108 109 110",
        'p_count{engine="a",instance="x"}': "_x32 1 1 1 stale 4 4 4 4 4",
    }
    exact = [case(expr("c"), "40m", 110 - 100), case(expr("p_count"), "40m", 4)]
    out = promtool(tmp_path, series, exact)
    assert "SUCCESS" in out, out


def test_an_instance_scraped_from_mid_window_is_judged_by_its_own_up(tmp_path: Path) -> None:
    # Instance a has served all along (60 in the window); b's exporter was first scraped at
    # 40m, its engine had counted 5000 before: b counts what Prometheus saw (30), not 5000 +
    # 30 for having fewer samples than a's up.
    series = {
        **up_with("1x80", "a"),
        **up_with("_x40 1x40", "b"),
        'c{engine="a",instance="a"}': "2+1x80",
        'c{engine="a",instance="b"}': "_x40 5000+1x40",
    }
    out = promtool(tmp_path, series, [case(expr("c"), "70m", 60 + 30)])
    assert "SUCCESS" in out, out


def test_a_restart_at_the_windows_start_counts_from_zero(tmp_path: Path) -> None:
    # The window is (10m30s, 70m30s]: the last sample before it is 1010 at 10m, the engine
    # restarted before the first one in it (1 at 11m). No reset inside the window, but the
    # counter is below its value before: it counts from zero, 60, not 60 - 1010.
    series = {**up_with("1x80"), 'c{engine="a",instance="x"}': "1000+1x10 1+1x69"}
    out = promtool(tmp_path, series, [case(expr("c"), "70m30s", 60)])
    assert "SUCCESS" in out, out


def test_a_series_new_since_the_hour_before_counts_from_zero(tmp_path: Path) -> None:
    # The exporter was scraped before the window; the histogram appeared at 40m with its first
    # 2 requests and reached 5 (a failed engine scrape at 45m in between): 5 from zero.
    series = {
        **up_with("1x44 0 1x35"),
        'p_count{engine="a",instance="x"}': "_x40 2 2 2 2 2 stale 5x25",
    }
    out = promtool(tmp_path, series, [case(expr("p_count"), "70m", 5)])
    assert "SUCCESS" in out, out
