"""Whole-exporter speed: one /metrics at a time, and 20 concurrent scrapers for a minute.

The exporter runs as its own process, as in production, with 1 GPU (fake NVML from the
H200 capture) and two engines: local aiohttp stubs answering with real captured bodies
(llama-server on the H200; SGLang 0.5.23 busy or idle) and counting the requests they get.

- `sequential`: `--requests` scrapes one after another (after `--warmup`); p50/p90/p99.
- `concurrent`: `--scrapers` clients for `--seconds`, each scraping once per `--interval`
  on a shared tick (`--phase aligned`, the worst case for an exporter that does not
  coalesce) or at random offsets (`--phase spread`); latency percentiles, the exporter's
  CPU (from /proc, user + system, as % of one core) and how many collections (engine
  /metrics requests) served them.
- Reference, in the same run: a bare aiohttp server in its own process answering every
  request with the exporter's own last /metrics body (pre-rendered bytes), scraped the
  same way. It is the floor set by HTTP, the client and the machine's load, and shows how
  busy the machine was during the run.

    .venv/bin/python bench/exporter_latency.py                     # both modes, busy SGLang
    .venv/bin/python bench/exporter_latency.py --mode sequential --requests 500 --sglang none
    git worktree add ../llmb-old fb4435c    # then, against the exporter before issue 12:
    .venv/bin/python bench/exporter_latency.py --baseline ../llmb-old
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import httpx
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
H200 = FIX / "llamacpp-h200-gemma3-27b-shape-q4_0"
SGL = FIX / "sglang-0.5.23"
SGL_ENDPOINTS = FIX / "sglang-0.5.23-endpoints"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _app(bodies: dict[str, str], hits: Counter[str]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        hits[request.path] += 1
        return web.Response(text=bodies[request.path])

    app = web.Application()
    for path in bodies:
        app.router.add_get(path, handle)
    return app


def llama_bodies() -> dict[str, str]:
    return {
        "/health": '{"status":"ok"}',
        "/metrics": (H200 / "metrics_np4_c4.txt").read_text(),
        "/slots": (H200 / "slots_np4_c4.json").read_text(),
        "/props": (H200 / "props.json").read_text(),
        "/v1/models": (H200 / "models.json").read_text(),
    }


def sglang_bodies(fixture: str) -> dict[str, str]:
    return {
        "/health": "",
        "/metrics": (SGL / f"metrics-{fixture}.txt").read_text(),
        "/server_info": (SGL_ENDPOINTS / "server_info.json").read_text(),
        "/model_info": (SGL_ENDPOINTS / "model_info.json").read_text(),
        "/v1/models": (SGL_ENDPOINTS / "v1_models.json").read_text(),
    }


async def serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Result:
    """One measured configuration (all times in ms)."""

    target: str
    mode: str
    requests: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    cpu_pct_of_core: float | None = None
    cpu_ms_per_scrape: float | None = None
    collections: int | None = None
    body_bytes: int = 0
    rss_mb: float | None = None

    def line(self) -> str:
        extra = ""
        if self.cpu_pct_of_core is not None:
            extra += f" cpu={self.cpu_pct_of_core:.1f}%core"
        if self.cpu_ms_per_scrape is not None:
            extra += f" cpu/scrape={self.cpu_ms_per_scrape:.2f}ms"
        if self.collections is not None:
            extra += f" collections={self.collections}"
        if self.rss_mb is not None:
            extra += f" rss={self.rss_mb:.0f}MB"
        return (
            f"{self.target:9s} {self.mode:10s} n={self.requests:5d} p50={self.p50:6.2f}ms "
            f"p90={self.p90:6.2f}ms p99={self.p99:6.2f}ms max={self.max:7.2f}ms "
            f"mean={self.mean:6.2f}ms body={self.body_bytes}B{extra}"
        )


def summarize(target: str, mode: str, seconds: list[float], body: int) -> Result:
    ms = [t * 1e3 for t in seconds]
    return Result(
        target,
        mode,
        len(ms),
        pct(ms, 0.5),
        pct(ms, 0.9),
        pct(ms, 0.99),
        max(ms),
        statistics.mean(ms),
        body_bytes=body,
    )


async def sequential(
    client: aiohttp.ClientSession, url: str, requests: int
) -> tuple[list[float], int]:
    times = []
    size = 0
    for _ in range(requests):
        start = time.perf_counter()
        async with client.get(url) as resp:
            body = await resp.read()
        times.append(time.perf_counter() - start)
        size = len(body)
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return times, size


def session() -> aiohttp.ClientSession:
    """One keep-alive connection, as a Prometheus target has; aiohttp's client is used
    because httpx's costs ~2 ms per response, which 20 scrapers in one process would
    queue behind each other and count as exporter latency."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=30)
    )


async def concurrent(
    url: str, scrapers: int, seconds: float, interval: float, phase: str
) -> tuple[list[float], int]:
    """`scrapers` clients (one connection each) scraping every `interval` for `seconds`."""
    times: list[float] = []
    failures = 0
    loop = asyncio.get_running_loop()
    rng = random.Random(1)
    # Prometheus keeps its connection to a target open between scrapes: each scraper opens
    # its own with one untimed request first, and the timed ticks start once all are open.
    opened = 0
    all_open = asyncio.Event()
    start = end = 0.0

    async def scraper(offset: float) -> None:
        nonlocal failures, opened, start, end
        async with session() as client:
            async with client.get(url) as resp:
                await resp.read()
            opened += 1
            if opened == scrapers:
                start = loop.time() + 0.2
                end = start + seconds
                all_open.set()
            await all_open.wait()
            tick = start + offset
            while tick < end:
                await asyncio.sleep(max(0.0, tick - loop.time()))
                t0 = time.perf_counter()
                async with client.get(url) as resp:
                    await resp.read()
                times.append(time.perf_counter() - t0)
                failures += resp.status != 200
                tick += interval

    offsets = [0.0 if phase == "aligned" else rng.uniform(0, interval) for _ in range(scrapers)]
    await asyncio.gather(*(scraper(o) for o in offsets))
    if failures:
        raise RuntimeError(f"{failures} scrapes failed")
    return times, 0


async def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError(f"{url}: process exited with {proc.returncode}")
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def measured(
    pid: int, run: Callable[[], Awaitable[tuple[list[float], int]]]
) -> tuple[list[float], int, float, float]:
    """Run `run`: its times and body size, the process' CPU seconds and the wall seconds."""
    cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
    times, size = await run()
    return times, size, cpu_seconds(pid) - cpu0, time.perf_counter() - wall0


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--mode", choices=["sequential", "concurrent", "both"], default="both")
    parser.add_argument("--requests", type=int, default=500, help="sequential scrapes")
    parser.add_argument("--warmup", type=int, default=20, help="sequential scrapes not timed")
    parser.add_argument("--scrapers", type=int, default=20, help="concurrent scrapers")
    parser.add_argument("--seconds", type=float, default=60.0, help="concurrent duration")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--phase", choices=["aligned", "spread"], default="aligned")
    parser.add_argument(
        "--min-interval", type=float, default=0.0, help="the exporter's min_interval config"
    )
    exposition = "which captured SGLang exposition the second engine serves (none: llama.cpp only)"
    parser.add_argument(
        "--sglang", choices=["busy", "idle", "none"], default="busy", help=exposition
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of the repository (e.g. a `git worktree` of an older commit): "
        "its exporter is measured too, alternating with this one under the same load",
    )
    parser.add_argument(
        "--model-path",
        type=Path,
        help="a GGUF for the llama.cpp engine (`model_path`): its geometry and model-structure "
        "series (always-read / routed-expert bytes, E, k) are then part of every scrape",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()

    load_before = os.getloadavg()
    lp, sp, ep, rp, bp = _port(), _port(), _port(), _port(), _port()
    llama_hits: Counter[str] = Counter()
    sgl_hits: Counter[str] = Counter()
    stubs = [await serve(_app(llama_bodies(), llama_hits), lp)]
    if args.sglang != "none":
        stubs.append(await serve(_app(sglang_bodies(args.sglang), sgl_hits), sp))
    results: list[Result] = []
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("LLMB__")}

    def config_text(port: int) -> str:
        return (
            f'listen: "127.0.0.1:{port}"\n'
            # Only when set, so that the bench also runs against exporters without the key.
            + (f"min_interval: {args.min_interval}\n" if args.min_interval else "")
            + "engines:\n"
            f'  - {{name: llama, kind: llamacpp, url: "http://127.0.0.1:{lp}"'
            + (f', model_path: "{args.model_path.resolve()}"' if args.model_path else "")
            + "}\n"
            + (
                f'  - {{name: sgl, kind: sglang, url: "http://127.0.0.1:{sp}"}}\n'
                if args.sglang != "none"
                else ""
            )
            + f"gpu: {{fake_file: [{H200 / 'nvml_6_np4_c4.json'}]}}\n"
        )

    def start_exporter(root: Path, port: int, tmp: str) -> subprocess.Popen[bytes]:
        config = Path(tmp) / f"config-{port}.yaml"
        config.write_text(config_text(port))
        argv = [sys.executable, "-m", "exporter", "--config", str(config)]
        proc = subprocess.Popen(
            [*argv, "--log-level", "WARNING"], cwd=root, env={**env, "PYTHONPATH": str(root)}
        )
        procs.append(proc)
        return proc

    with tempfile.TemporaryDirectory() as tmp:
        try:
            exporter = start_exporter(ROOT, ep, tmp)
            url = f"http://127.0.0.1:{ep}/metrics"
            await wait_ready(url, exporter)
            targets = [("exporter", exporter, url)]
            if args.baseline:
                baseline = start_exporter(args.baseline.resolve(), bp, tmp)
                base_url = f"http://127.0.0.1:{bp}/metrics"
                await wait_ready(base_url, baseline)
                async with session() as client:
                    await sequential(client, base_url, args.warmup)
                targets.append(("baseline", baseline, base_url))
            body = Path(tmp) / "body.txt"
            async with session() as client:
                await sequential(client, url, args.warmup)
                async with client.get(url) as resp:
                    body.write_bytes(await resp.read())
            reference = subprocess.Popen(  # noqa: ASYNC220 - started once, before timing
                [sys.executable, __file__, "--serve-static", str(body), "--port", str(rp)],
                env=env,
            )
            procs.append(reference)
            ref_url = f"http://127.0.0.1:{rp}/metrics"
            await wait_ready(ref_url, reference)
            targets.append(("reference", reference, ref_url))

            if args.mode in ("sequential", "both"):
                # Alternate blocks so that both see the same machine load.
                runs: dict[str, list[float]] = {name: [] for name, _, _ in targets}
                sizes: dict[str, int] = {}
                cpu = dict.fromkeys(runs, 0.0)
                wall = dict.fromkeys(runs, 0.0)
                async with session() as client:
                    for _ in range(5):
                        for name, proc, target in targets:
                            times, size, cpu_s, wall_s = await measured(
                                proc.pid,
                                functools.partial(sequential, client, target, args.requests // 5),
                            )
                            runs[name] += times
                            sizes[name] = size
                            cpu[name] += cpu_s
                            wall[name] += wall_s
                for name, proc, _ in targets:
                    result = summarize(name, "sequential", runs[name], sizes[name])
                    result.cpu_pct_of_core = 100 * cpu[name] / wall[name]
                    result.cpu_ms_per_scrape = 1e3 * cpu[name] / len(runs[name])
                    result.rss_mb = rss_mb(proc.pid)
                    results.append(result)

            if args.mode in ("concurrent", "both"):
                for name, proc, target in targets:
                    before = llama_hits["/metrics"]
                    times, _, cpu_s, wall_s = await measured(
                        proc.pid,
                        functools.partial(
                            concurrent,
                            target,
                            args.scrapers,
                            args.seconds,
                            args.interval,
                            args.phase,
                        ),
                    )
                    mode = f"{args.scrapers}x{args.phase}"
                    result = summarize(name, mode, times, body.stat().st_size)
                    result.cpu_pct_of_core = 100 * cpu_s / wall_s
                    result.cpu_ms_per_scrape = 1e3 * cpu_s / len(times)
                    result.rss_mb = rss_mb(proc.pid)
                    if name != "reference":
                        result.collections = llama_hits["/metrics"] - before
                    results.append(result)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=10)
            for stub in stubs:
                await stub.cleanup()
    load_after = os.getloadavg()
    print(
        f"cores={os.cpu_count()} sglang={args.sglang} min_interval={args.min_interval} "
        f"interval={args.interval}s load_before={load_before[0]:.1f} "
        f"load_after={load_after[0]:.1f}"
    )
    for result in results:
        print(result.line())
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "cores": os.cpu_count(),
                    "load_before": load_before,
                    "load_after": load_after,
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
        )
    return 0


def serve_static(path: Path, port: int) -> None:
    """The reference: aiohttp answering every /metrics with the same pre-rendered bytes."""
    body = path.read_bytes()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    if "--serve-static" in sys.argv:
        static = argparse.ArgumentParser()
        static.add_argument("--serve-static", type=Path, required=True)
        static.add_argument("--port", type=int, required=True)
        opts = static.parse_args()
        serve_static(opts.serve_static, opts.port)
        sys.exit(0)
    sys.exit(asyncio.run(main()))
