"""Prometheus fixtures: a real `prometheus` with the shipped rules, and PromQL name checks.

`prometheus_server` starts Debian's `prometheus` on a free loopback port with a config
generated from `prometheus/prometheus.yml` (same rule files, 1s scrape and evaluation,
targets given by the test, tmp storage) and gives an instant-query helper.

`QueryRecorder(upstream)` stands in front of a real Prometheus and keeps every instant query
and its answer (the fixtures of tests/fixtures/served-mix-*); `RecordedPrometheus(answers)`
answers the recorded queries again, in-process, for the unit tests; both it and the unit
tests' own stand-ins are `QueryAnswers` (the query API, the queries asked kept).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import yaml
from aiohttp import web

from exporter.schema import SCHEMA
from tests.plugins.engine_stubs import ThreadedApp

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "prometheus"
# `promtool test rules` files live beside the rules they test.
PROMTOOL_TESTS = PROMETHEUS_DIR / "rules" / "tests"
RULE_FILES = ("recording.yml", "verdict.yml", "alerts.yml")

# The load generator's series (issue 4; loadgen/metrics.py), as Prometheus stores them.
LOADGEN_SERIES = {
    "llmb_loadgen_requests_in_flight": "gauge",
    "llmb_loadgen_requests_total": "counter",
    "llmb_loadgen_completion_tokens_total": "counter",
    "llmb_loadgen_prompt_tokens_total": "counter",
    "llmb_loadgen_early_stop_requests_total": "counter",
    "llmb_loadgen_step_info": "info",
    "llmb_loadgen_step_start_timestamp_seconds": "gauge",
    "llmb_loadgen_token_count_mismatch": "gauge",
    "llmb_loadgen_goodput_requests_total": "counter",
    "llmb_loadgen_goodput_completion_tokens_total": "counter",
    "llmb_loadgen_slo_info": "info",
    "llmb_loadgen_phase_info": "info",
    "llmb_loadgen_time_to_first_token_seconds": "histogram",
    "llmb_loadgen_inter_token_latency_seconds": "histogram",
    "llmb_loadgen_e2e_request_latency_seconds": "histogram",
}
# Prometheus' own per-target series; only `up` is used (LLMExporterDown).
BUILTIN_SERIES = {"up"}

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def _sample_names(name: str, kind: str) -> set[str]:
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def schema_series() -> set[str]:
    """Every sample name the exporter and the load generator can produce."""
    names: set[str] = set()
    for name, spec in SCHEMA.items():
        names |= _sample_names(name, spec.type)
    for name, kind in LOADGEN_SERIES.items():
        names |= _sample_names(name, kind)
    return names


def rule_groups() -> list[dict[str, Any]]:
    """All rule groups of the shipped rule files."""
    groups: list[dict[str, Any]] = []
    for name in RULE_FILES:
        doc = yaml.safe_load((PROMETHEUS_DIR / "rules" / name).read_text(encoding="utf-8"))
        groups.extend(doc["groups"])
    return groups


def recorded_series() -> set[str]:
    """Names recorded by the shipped recording rules."""
    return {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}


def known_series() -> set[str]:
    """Names a rule or a dashboard may query."""
    return schema_series() | recorded_series() | BUILTIN_SERIES


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords and labels removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, regexes)
    text = re.sub(r"\{[^{}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery windows
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # label lists of aggregations and vector matching
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?!\w)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


@dataclass
class PrometheusServer:
    """A running Prometheus and how to ask it things."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; returns the result vector (raises on a PromQL error)."""
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else [result]

    def get(self, path: str) -> dict[str, Any]:
        """GET an API path (e.g. /api/v1/alerts) and return its data."""
        resp = httpx.get(f"{self.url}{path}", timeout=10)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()["data"]
        return data

    def wait_until(
        self, check: Callable[[], bool], timeout: float, what: str, every: float = 1.0
    ) -> None:
        """Poll `check` until it is true or fail after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(every)
        raise AssertionError(
            f"timed out after {timeout:.0f}s waiting for {what}; {self.log_tail()}"
        )

    def log_tail(self) -> str:
        """Last lines of Prometheus' log, for failure messages."""
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "prometheus log:\n" + "\n".join(lines[-20:])


def prometheus_config(
    targets: dict[str, list[str]],
    interval: str | None = None,
    job_settings: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The shipped config with the test's targets and no Alertmanager.

    `interval` replaces the scrape and evaluation interval (and the scrape timeout); None
    keeps the shipped ones. `job_settings` adds keys to a job (e.g. `scheme`, `basic_auth`).
    """
    doc = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text(encoding="utf-8"))
    if interval is not None:
        doc["global"] = {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        }
    doc["rule_files"] = [str(PROMETHEUS_DIR / "rules" / name) for name in RULE_FILES]
    doc.pop("alerting", None)
    jobs = {job["job_name"] for job in doc["scrape_configs"]}
    unknown = set(targets) - jobs
    if unknown:
        raise ValueError(f"jobs {sorted(unknown)} are not in prometheus/prometheus.yml")
    settings = job_settings or {}
    doc["scrape_configs"] = [
        {
            **job,
            **settings.get(job["job_name"], {}),
            "static_configs": [{"targets": targets[job["job_name"]]}],
        }
        for job in doc["scrape_configs"]
        if job["job_name"] in targets
    ]
    return doc


def start_prometheus(
    workdir: Path,
    port: int,
    targets: dict[str, list[str]],
    interval: str | None = "1s",
    job_settings: dict[str, dict[str, Any]] | None = None,
) -> PrometheusServer:
    """Start `prometheus` and wait until it is ready (at most 30 s)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed (Debian package `prometheus`)")
    config = workdir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(prometheus_config(targets, interval, job_settings)), encoding="utf-8"
    )
    log_path = workdir / "prometheus.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    server = PrometheusServer(f"http://127.0.0.1:{port}", process, log_path)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(
                f"prometheus exited with {process.returncode}; {server.log_tail()}"
            )
        try:
            return httpx.get(f"{server.url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    server.wait_until(ready, 30, "prometheus to be ready", every=0.2)
    return server


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """Terminate a child process we started, killing it if it does not exit in time."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


@pytest.fixture
def prometheus_server(
    tmp_path: Path,
) -> Iterator[Callable[[dict[str, list[str]]], PrometheusServer]]:
    """Factory: start Prometheus with the shipped rules scraping the given job targets."""
    started: list[PrometheusServer] = []

    def start(targets: dict[str, list[str]]) -> PrometheusServer:
        from tests.conftest import get_free_port

        workdir = tmp_path / f"prometheus-{len(started)}"
        workdir.mkdir()
        server = start_prometheus(workdir, get_free_port(), targets)
        started.append(server)
        return server

    yield start
    for server in started:
        stop_process(server.process)


class QueryRecorder(ThreadedApp):
    """A pass-through of Prometheus' `/api/v1/query` to `upstream` that keeps each query, the
    HTTP status and the JSON answer in `answers`, in order."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream
        self.answers: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.upstream + request.path, params=request.query) as resp,
        ):
            body = await resp.json(content_type=None)
            status = resp.status
        self.answers.append(
            {"query": request.query.get("query", ""), "status": status, "body": body}
        )
        return web.json_response(body, status=status)


class QueryAnswers(ThreadedApp):
    """A Prometheus stand-in: `/api/v1/query` answered by `answer(query)` (HTTP status, JSON
    body); `asked` keeps the queries asked, `times` their evaluation time (`time`, None: now)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []
        self.times: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, query: str) -> tuple[int, Any]:
        """The status and body of `query`'s answer."""
        raise NotImplementedError

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = request.query.get("query", "")
        self.asked.append(query)
        self.times.append(request.query.get("time"))
        status, body = self.answer(query)
        return web.json_response(body, status=status)


class RecordedPrometheus(QueryAnswers):
    """`/api/v1/query` answered from recorded answers (the query text must match exactly);
    a query never recorded gets Prometheus' own error shape (HTTP 400), so a changed query
    fails loudly. `asked` keeps the queries asked."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        super().__init__()
        self.answers = {a["query"]: (a["status"], a["body"]) for a in answers}

    def answer(self, query: str) -> tuple[int, Any]:
        error = {"status": "error", "errorType": "bad_data", "error": f"not recorded: {query}"}
        return self.answers.get(query, (400, error))
