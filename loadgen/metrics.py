"""Live client-side metrics on the load generator's own `/metrics` (`llmb_loadgen_*`).

Each `LoadgenMetrics` owns a fresh `CollectorRegistry`, so two runs in one process (tests,
sweeps driven from Python) never share or clash on series.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from core import series as llmb
from core.slo import Slo
from loadgen.results import RequestRecord

log = logging.getLogger(__name__)
M = TypeVar("M", Counter, Gauge)

DEFAULT_PORT = 9491

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60)
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 1, 2,
)  # fmt: skip
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)


class BulkHistogram:
    """A histogram with label `engine` that takes a request's gaps in one call.

    A request streams hundreds of chunks; client_python's `Histogram.observe` takes a lock
    and walks the buckets per value, which costs more than parsing the chunk itself.
    """

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ):
        self.name = name
        self.documentation = documentation
        self.buckets = tuple(buckets)
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        registry.register(self)

    def observe_many(self, engine: str, values: Sequence[float]) -> None:
        """Account every value of `values` for `engine`."""
        series = self._series.get(engine)
        if series is None:
            series = self._series[engine] = ([0] * (len(self.buckets) + 1), [0.0])
        counts, total = series
        bounds = self.buckets
        for value in values:
            counts[bisect_left(bounds, value)] += 1
        total[0] += sum(values)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=["engine"])

    def describe(self) -> list[Metric]:
        """The family without samples (registry name checks)."""
        return [self._family()]

    def collect(self) -> list[Metric]:
        """Cumulative `le` buckets per engine, as client_python's Histogram renders them."""
        family = self._family()
        for engine, (counts, total) in self._series.items():
            running = 0
            buckets = []
            for bound, count in zip((*self.buckets, float("inf")), counts, strict=True):
                running += count
                buckets.append((floatToGoString(bound), float(running)))
            family.add_metric([engine], buckets, total[0])
        return [family]


class StepStart(NamedTuple):
    """The step one engine starts: what `llmb_loadgen_step` publishes."""

    engine: str
    step: int
    concurrency: int | None
    prompt_tokens: int | None
    max_tokens: int


class Family(NamedTuple):
    """One `llmb_loadgen_*` family as docs/metrics.md states it; `meaning` is its HELP too."""

    type: str
    labels: tuple[str, ...]
    meaning: str


_ENGINE = ("engine",)
_INFO = "info (gauge 1)"

# The load generator's families, in docs/metrics.md's order: the one owner of their type,
# labels and meaning. The registry's HELP and the doc's table (`markdown_table`) read it;
# tests/unit/test_loadgen_run.py checks the doc and what the registry exposes against it.
FAMILIES: dict[str, Family] = {
    llmb.LOADGEN_TIME_TO_FIRST_TOKEN_SECONDS: Family(
        "histogram", _ENGINE, "client-side time from sending a request to its first streamed token"
    ),
    llmb.LOADGEN_INTER_TOKEN_LATENCY_SECONDS: Family(
        "histogram", _ENGINE, "gap between consecutive streamed token chunks"
    ),
    llmb.LOADGEN_E2E_REQUEST_LATENCY_SECONDS: Family(
        "histogram",
        _ENGINE,
        "time from sending to the end of the stream (ok and early-stopped requests)",
    ),
    llmb.LOADGEN_REQUESTS_IN_FLIGHT: Family("gauge", _ENGINE, "requests sent and not finished"),
    llmb.LOADGEN_REQUESTS_TOTAL: Family(
        "counter",
        ("engine", "outcome"),
        "finished requests: `ok`, `early_stop`, `timeout`, `connect_error`, `http_error`, "
        "`server_error`, `malformed`, `disconnected`, `interrupted`",
    ),
    llmb.LOADGEN_COMPLETION_TOKENS_TOTAL: Family(
        "counter", _ENGINE, "completion tokens from the server's `usage`"
    ),
    llmb.LOADGEN_PROMPT_TOKENS_TOTAL: Family(
        "counter", _ENGINE, "prompt tokens from the server's `usage` (cached ones included)"
    ),
    llmb.LOADGEN_EARLY_STOP_REQUESTS_TOTAL: Family(
        "counter", _ENGINE, "requests with fewer completion tokens than `max_tokens`"
    ),
    llmb.LOADGEN_STEP_INFO: Family(
        _INFO,
        ("engine", "step", "concurrency", "prompt_tokens", "max_tokens"),
        "the step now running for the engine (for annotations)",
    ),
    llmb.LOADGEN_STEP_START_TIMESTAMP_SECONDS: Family(
        "gauge", _ENGINE, "Unix time the engine's current step started"
    ),
    llmb.LOADGEN_TOKEN_COUNT_MISMATCH: Family(
        "gauge",
        _ENGINE,
        "1 when this run's token counts differ across engines or from `max_tokens` (alert "
        "`LLMTokenCountMismatch`), else 0",
    ),
    llmb.LOADGEN_GOODPUT_REQUESTS_TOTAL: Family(
        "counter",
        _ENGINE,
        "with `--slo`: finished requests within it (their TTFT, end-to-end time and own "
        "inter-token gap each within its limit; `core/slo.py`)",
    ),
    llmb.LOADGEN_GOODPUT_COMPLETION_TOKENS_TOTAL: Family(
        "counter", _ENGINE, "with `--slo`: completion tokens of those requests"
    ),
    llmb.LOADGEN_SLO_INFO: Family(_INFO, ("slo",), "with `--slo`: the SLO as given"),
}


def markdown_table() -> str:
    """docs/metrics.md's table of the load generator's series (`python -m loadgen.metrics`)."""
    rows = ["| name | type | labels | meaning |", "|---|---|---|---|"]
    for name, family in FAMILIES.items():
        labels = ", ".join(f"`{label}`" for label in family.labels)
        rows.append(f"| `{name}` | {family.type} | {labels} | {family.meaning} |")
    return "\n".join(rows) + "\n"


def _help(name: str) -> str:
    return FAMILIES[name].meaning


class LoadgenMetrics:
    """The `llmb_loadgen_*` series of one load-generator run."""

    def __init__(self, slo: Slo | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.slo = slo
        r = self.registry
        ttft, itl, e2e = (
            llmb.LOADGEN_TIME_TO_FIRST_TOKEN_SECONDS,
            llmb.LOADGEN_INTER_TOKEN_LATENCY_SECONDS,
            llmb.LOADGEN_E2E_REQUEST_LATENCY_SECONDS,
        )
        self.ttft = Histogram(ttft, _help(ttft), _ENGINE, buckets=TTFT_BUCKETS, registry=r)
        self.itl = BulkHistogram(itl, _help(itl), ITL_BUCKETS, registry=r)
        self.e2e = Histogram(e2e, _help(e2e), _ENGINE, buckets=E2E_BUCKETS, registry=r)
        requests = llmb.LOADGEN_REQUESTS_TOTAL
        self.requests = Counter(requests, _help(requests), FAMILIES[requests].labels, registry=r)
        # The per-engine series, labelled `engine` only.
        counter, gauge = self._per_engine(Counter), self._per_engine(Gauge)
        self.in_flight = gauge(llmb.LOADGEN_REQUESTS_IN_FLIGHT)
        self.completion_tokens = counter(llmb.LOADGEN_COMPLETION_TOKENS_TOTAL)
        self.prompt_tokens = counter(llmb.LOADGEN_PROMPT_TOKENS_TOTAL)
        self.early_stop = counter(llmb.LOADGEN_EARLY_STOP_REQUESTS_TOTAL)
        # client_python appends `_info` to an Info's name; its other labels are the values.
        self.step = Info(
            llmb.LOADGEN_STEP_INFO.removesuffix("_info"),
            _help(llmb.LOADGEN_STEP_INFO),
            _ENGINE,
            registry=r,
        )
        self.step_start = gauge(llmb.LOADGEN_STEP_START_TIMESTAMP_SECONDS)
        self.mismatch = gauge(llmb.LOADGEN_TOKEN_COUNT_MISMATCH)
        # Goodput (`--slo`): requests, and their completion tokens, within every limit.
        self.goodput_requests = counter(llmb.LOADGEN_GOODPUT_REQUESTS_TOTAL)
        self.goodput_tokens = counter(llmb.LOADGEN_GOODPUT_COMPLETION_TOKENS_TOTAL)
        if slo is not None:
            name = llmb.LOADGEN_SLO_INFO
            Info(name.removesuffix("_info"), _help(name), registry=r).info({"slo": slo.text()})
        self._children: dict[str, tuple[Histogram, Histogram, Counter, Counter]] = {}
        self._outcomes: dict[tuple[str, str], Counter] = {}
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def _per_engine(self, kind: Callable[..., M]) -> Callable[[str], M]:
        """A constructor of `kind` series labelled `engine`, in this run's registry."""
        return lambda name: kind(name, _help(name), _ENGINE, registry=self.registry)

    def start_step(self, start: StepStart) -> None:
        """Publish the step now running for `start.engine`."""
        engine = start.engine
        self.step.labels(engine).info(
            {
                "step": str(start.step),
                "concurrency": "" if start.concurrency is None else str(start.concurrency),
                "prompt_tokens": "" if start.prompt_tokens is None else str(start.prompt_tokens),
                "max_tokens": str(start.max_tokens),
            }
        )
        self.step_start.labels(engine).set(time.time())
        self.mismatch.labels(engine).set(0)
        for child in (self.in_flight, self.completion_tokens, self.prompt_tokens):
            child.labels(engine)  # create the series at 0 so rate() has a start
        self.early_stop.labels(engine)
        if self.slo is not None:
            self.goodput_requests.labels(engine)
            self.goodput_tokens.labels(engine)

    def observe(self, record: RequestRecord) -> None:
        """Account one finished request."""
        engine = record.engine
        children = self._children.get(engine)
        if children is None:
            # labels() costs a lock and a tuple per call; resolve each engine's series once.
            children = self._children[engine] = (
                self.ttft.labels(engine),
                self.e2e.labels(engine),
                self.prompt_tokens.labels(engine),
                self.completion_tokens.labels(engine),
            )
        ttft, e2e, prompt_tokens, completion_tokens = children
        key = (engine, record.error or "ok")
        outcome = self._outcomes.get(key)
        if outcome is None:
            outcome = self._outcomes[key] = self.requests.labels(*key)
        outcome.inc()
        if record.error == "early_stop":
            self.early_stop.labels(engine).inc()
        if record.prompt_tokens:
            prompt_tokens.inc(record.prompt_tokens)
        if record.completion_tokens:
            completion_tokens.inc(record.completion_tokens)
        if record.ttft_s is not None:
            ttft.observe(record.ttft_s)
        if record.error is None or record.error == "early_stop":
            e2e.observe(record.e2e_s)
        self.itl.observe_many(engine, record.itls)
        if self.slo is not None and self.slo.within(record):
            self.goodput_requests.labels(engine).inc()
            self.goodput_tokens.labels(engine).inc(record.completion_tokens or 0)

    def set_mismatch(self, engine: str, mismatch: bool) -> None:
        """Raise or clear the token-count mismatch flag of `engine`."""
        self.mismatch.labels(engine).set(1 if mismatch else 0)

    async def serve(self, host: str, port: int) -> int:
        """Serve `/metrics` on host:port (port 0 picks a free one); return the bound port."""

        async def handler(request: web.Request) -> web.Response:
            encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
            resp = web.Response(body=encoder(self.registry))
            resp.headers["Content-Type"] = content_type
            return resp

        app = web.Application()
        app.router.add_get("/metrics", handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        log.info("client metrics on http://%s:%d/metrics", host, self.port)
        return self.port

    async def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


if __name__ == "__main__":
    print(markdown_table(), end="")
