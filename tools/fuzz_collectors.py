"""Fuzz the engine collectors with mutated real engine answers, over real HTTP.

Every case takes the captured answers of a real llama-server (CPU, Gemma 3 270M) or a real
SGLang 0.5.23 (tests/fixtures/), mutates one of them (structure-aware for JSON and the
Prometheus text format, or raw bytes), serves them from a fake engine on 127.0.0.1 and
scrapes the real exporter application (`exporter.server.make_app`) on 127.0.0.1. Counted:

* exceptions that escaped a collector (the runner logs "source X crashed");
* HTTP answers of the exporter other than 200;
* outputs that `promtool check metrics` rejects (every distinct output is checked);
* resident memory of this process, every 500 cases.

    python -m tools.fuzz_collectors --cases 10000 --seed 1

The mutators (tools/fuzz_mutators.py) also drive the hypothesis tests
(tests/unit/test_fuzz_collectors.py).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import logging
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from core import series as llmb
from tools.fuzz_mutators import mutate_body, mutate_log

if TYPE_CHECKING:
    import httpx

    from exporter.runner import Runner

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
LLAMA = FIXTURES / "llamacpp-cpu-gemma3-270m"
SGLANG = FIXTURES / "sglang-0.5.23"
SGLANG_ENDPOINTS = FIXTURES / "sglang-0.5.23-endpoints"

# Real answers, by engine kind and path.
BODIES: dict[str, dict[str, Path]] = {
    "llamacpp": {
        "/metrics": LLAMA / "llamacpp_metrics_busy.txt",
        "/slots": LLAMA / "slots_busy.json",
        "/props": LLAMA / "props.json",
        "/v1/models": LLAMA / "v1_models.json",
    },
    "sglang": {
        "/metrics": SGLANG / "metrics-busy.txt",
        "/server_info": SGLANG_ENDPOINTS / "server_info.json",
        "/model_info": SGLANG_ENDPOINTS / "model_info.json",
        "/v1/models": SGLANG_ENDPOINTS / "v1_models.json",
    },
}
LLAMA_LOG = LLAMA / "server.log"


@dataclass
class PromtoolTally:
    """`promtool check metrics` over every distinct exporter answer."""

    checked: int = 0
    rejected: int = 0
    examples: list[str] = field(default_factory=list)  # the first three rejections

    def record(self, ok: bool, problems: str) -> None:
        """Count one checked answer; keep the start of the first rejections."""
        self.checked += 1
        if not ok:
            self.rejected += 1
            if len(self.examples) < 3:
                self.examples.append(problems[:500])


@dataclass
class Counts:
    """What the fuzz run found."""

    cases: int = 0
    escaped: int = 0
    http_errors: int = 0
    promtool: PromtoolTally = field(default_factory=PromtoolTally)
    by_reason: Counter[str] = field(default_factory=Counter)
    rss_mib: list[float] = field(default_factory=list)


class _CrashCounter(logging.Handler):
    """Counts the runner's 'source X crashed' log records: exceptions out of a collector."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "crashed" in record.getMessage():
            self.count += 1


# Series whose values change every scrape (durations, cumulative error counts): masked when
# deciding whether promtool has seen an output already.
_VOLATILE = re.compile(
    "^((?:"
    + "|".join(
        (
            llmb.SOURCE_UP,
            llmb.SOURCE_DURATION_SECONDS,
            llmb.SOURCE_ERRORS_TOTAL,
            llmb.ENGINE_RESTARTS_TOTAL,
        )
    )
    + r")[^ ]*) .*$",
    re.MULTILINE,
)


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def _promtool_ok(promtool: str, text: str) -> tuple[bool, str]:
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    # Lint findings (names, units) go to stdout with exit 0 or 3; only format errors fail.
    problems = proc.stderr.decode(errors="replace") + proc.stdout.decode(errors="replace")
    return proc.returncode in (0, 3) and "error" not in proc.stderr.decode().lower(), problems


class _Served:
    """The answers the fake engines give now: the real ones, one of them mutated per case."""

    def __init__(self, log_file: Path) -> None:
        self.real = {
            k: {p: f.read_bytes() for p, f in paths.items()} for k, paths in BODIES.items()
        }
        self.now = {kind: dict(bodies) for kind, bodies in self.real.items()}
        self.log_file, self.log_text, self.log_dirty = log_file, LLAMA_LOG.read_text(), False
        log_file.write_text(self.log_text)

    def app(self, kind: str) -> web.Application:
        """A fake engine of `kind` on its current answers (404 for any other path)."""

        async def handle(request: web.Request) -> web.Response:
            if request.path == "/health":
                return web.Response(text='{"status":"ok"}')
            path = "/model_info" if request.path == "/get_model_info" else request.path
            body = self.now[kind].get(path)
            return web.Response(status=404) if body is None else web.Response(body=body)

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handle)
        return app

    def mutate(self, rng: random.Random) -> None:
        """Restore every answer, then mutate one (and, now and then, llama.cpp's log)."""
        for kind in BODIES:
            self.now[kind] = dict(self.real[kind])
        kind = rng.choice(list(BODIES))
        path = rng.choice(list(BODIES[kind]))
        self.now[kind][path] = mutate_body(path, self.real[kind][path], rng)
        if kind == "llamacpp" and rng.random() < 0.1:
            self.log_file.write_text(mutate_log(self.log_text, rng), errors="surrogateescape")
            self.log_dirty = True
        elif self.log_dirty:
            self.log_file.write_text(self.log_text)
            self.log_dirty = False


def _exporter(ports: dict[str, int | None], log_file: Path) -> Runner:
    """The real exporter's runner over both fake engines, with clocks that jump a minute."""
    from config.settings import parse_config
    from exporter.app import build_runner

    url = "http://127.0.0.1:{}".format
    engines = [
        {
            "name": "llama",
            "kind": "llamacpp",
            "url": url(ports["llamacpp"]),
            "log_file": str(log_file),
        },
        {"name": "sgl", "kind": "sglang", "url": url(ports["sglang"])},
    ]
    runner = build_runner(parse_config({"engines": engines, "gpu": {"enabled": False}}))
    # Collectors re-read their static endpoints (/v1/models, /server_info...) only every 60 s;
    # a clock that jumps a minute per reading makes every case reach them.
    jumps = itertools.count(0.0, 61.0)
    for collector in runner.collectors:
        for attr in ("clock", "_clock"):
            if hasattr(collector, attr):
                setattr(collector, attr, lambda: next(jumps))
    return runner


def _crash_counter() -> _CrashCounter:
    crashes = _CrashCounter()
    logger = logging.getLogger("exporter")
    logger.addHandler(crashes)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return crashes


@dataclass
class _Scrapes:
    """Scrapes of the exporter, each answer counted (and promtool-checked once per shape)."""

    url: str
    promtool: str | None
    counts: Counts = field(default_factory=Counts)
    seen: set[bytes] = field(default_factory=set)

    async def scrape(self, client: httpx.AsyncClient) -> None:
        resp = await client.get(
            self.url, headers={"X-Prometheus-Scrape-Timeout-Seconds": "4"}, timeout=30
        )
        self.counts.cases += 1
        if resp.status_code != 200:
            self.counts.http_errors += 1
            return
        # Outputs differ in values mostly; promtool sees every distinct output.
        digest = hashlib.sha256(_VOLATILE.sub(r"\1 0", resp.text).encode()).digest()
        if self.promtool and digest not in self.seen:
            self.seen.add(digest)
            self.counts.promtool.record(*_promtool_ok(self.promtool, resp.text))


async def run(
    cases: int, seed: int, promtool: str | None, progress: Callable[[str], None]
) -> Counts:
    """Fuzz `cases` mutated answers through the real exporter over HTTP."""
    import httpx
    from aiohttp.test_utils import TestServer

    from exporter.server import make_app

    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="llmb-fuzz-"))
    served = _Served(workdir / "llama.log")
    engines = {kind: TestServer(served.app(kind), host="127.0.0.1") for kind in BODIES}
    for server in engines.values():
        await server.start_server()
    crashes = _crash_counter()
    runner = _exporter({kind: s.port for kind, s in engines.items()}, served.log_file)
    exporter = TestServer(make_app(runner), host="127.0.0.1")
    await exporter.start_server()
    scrapes = _Scrapes(f"http://127.0.0.1:{exporter.port}/metrics", promtool)
    counts, started = scrapes.counts, time.monotonic()
    try:
        async with httpx.AsyncClient() as client:
            for case in range(cases):
                served.mutate(rng)
                await scrapes.scrape(client)
                if case % 500 == 0 or case == cases - 1:
                    counts.rss_mib.append(round(_rss_mib(), 1))
                    progress(
                        f"{case + 1}/{cases} cases, {time.monotonic() - started:.0f} s, "
                        f"RSS {counts.rss_mib[-1]} MiB, escaped {crashes.count}, "
                        f"HTTP errors {counts.http_errors}, promtool rejected "
                        f"{counts.promtool.rejected}/{counts.promtool.checked}"
                    )
        counts.escaped = crashes.count
        for (_source, reason), n in runner._errors.items():
            counts.by_reason[reason] += n
    finally:
        await exporter.close()
        for server in engines.values():
            await server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--cases", type=int, default=10_000, help="mutated answers to serve")
    parser.add_argument("--seed", type=int, default=1, help="random seed (same seed, same cases)")
    parser.add_argument(
        "--promtool", default=shutil.which("promtool") or "", help="promtool binary ('' = skip)"
    )
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error("--cases must be at least 1")
    counts = asyncio.run(
        run(args.cases, args.seed, args.promtool or None, lambda m: print(m, file=sys.stderr))
    )
    report = {
        "cases": counts.cases,
        "exceptions_escaping_a_collector": counts.escaped,
        "http_non_200": counts.http_errors,
        "promtool_checked_distinct_outputs": counts.promtool.checked,
        "promtool_rejected": counts.promtool.rejected,
        "source_errors_by_reason": dict(sorted(counts.by_reason.items())),
        "rss_mib_first_last_max": [counts.rss_mib[0], counts.rss_mib[-1], max(counts.rss_mib)],
        "rejected_examples": counts.promtool.examples,
    }
    print(json.dumps(report, indent=2))
    failed = counts.escaped or counts.http_errors or counts.promtool.rejected
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
