"""Latency of one exporter /metrics request: 1 GPU (fake NVML from the H200 capture) + 2 engines.

The engines are local aiohttp stubs answering with the real captured bodies
(llama-server on the H200, SGLang 0.5.23 busy). The exporter runs as a separate
process, as in production, and is scraped sequentially.

    .venv/bin/python bench/exporter_latency.py --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
H200 = FIX / "llamacpp-h200-gemma3-27b-shape-q4_0"
SGL = FIX / "sglang-0.5.23"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_app() -> web.Application:
    bodies = {
        "/health": '{"status":"ok"}',
        "/metrics": (H200 / "metrics_np4_c4.txt").read_text(),
        "/slots": (H200 / "slots_np4_c4.json").read_text(),
        "/props": (H200 / "props.json").read_text(),
        "/v1/models": (H200 / "models.json").read_text(),
    }
    app = web.Application()
    for path, body in bodies.items():
        app.router.add_get(path, lambda r, b=body: web.Response(text=b))
    return app


def sglang_app(fixture: str) -> web.Application:
    metrics = (SGL / f"metrics-{fixture}.txt").read_text()
    server_info = (
        '{"model_path":"google/gemma-3-27b-it","served_model_name":"google/gemma-3-27b-it",'
        '"version":"0.5.23","max_running_requests":48,"context_length":8192,'
        '"internal_states":[{"effective_max_running_requests_per_dp":48}]}'
    )
    bodies = {
        "/health": "",
        "/metrics": metrics,
        "/server_info": server_info,
        "/model_info": '{"model_path":"google/gemma-3-27b-it","is_generation":true}',
        "/v1/models": (
            '{"object":"list","data":[{"id":"google/gemma-3-27b-it","max_model_len":8192}]}'
        ),
    }
    app = web.Application()
    for path, body in bodies.items():
        app.router.add_get(path, lambda r, b=body: web.Response(text=b))
    return app


async def serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--sglang",
        choices=["busy", "idle", "none"],
        default="busy",
        help="which captured SGLang exposition the second engine serves (none: llama.cpp only)",
    )
    args = parser.parse_args()

    lp, sp, ep = _port(), _port(), _port()
    stubs = [await serve(llama_app(), lp)]
    if args.sglang != "none":
        stubs.append(await serve(sglang_app(args.sglang), sp))
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            f'listen: "127.0.0.1:{ep}"\n'
            "engines:\n"
            f'  - {{name: llama, kind: llamacpp, url: "http://127.0.0.1:{lp}"}}\n'
            + (
                f'  - {{name: sgl, kind: sglang, url: "http://127.0.0.1:{sp}"}}\n'
                if args.sglang != "none"
                else ""
            )
            + f"gpu: {{fake_file: [{H200 / 'nvml_6_np4_c4.json'}]}}\n"
        )
        # The stubs run in this process; run the exporter in its own, as in production.
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before timing
            [sys.executable, "-m", "exporter", "--config", str(config), "--log-level", "WARNING"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            async with httpx.AsyncClient() as client:
                url = f"http://127.0.0.1:{ep}/metrics"
                for _ in range(100):
                    try:
                        if (await client.get(url)).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(0.1)
                for _ in range(args.warmup):
                    await client.get(url)
                times = []
                size = 0
                for _ in range(args.requests):
                    start = time.perf_counter()
                    resp = await client.get(url)
                    times.append(time.perf_counter() - start)
                    size = len(resp.content)
                    assert resp.status_code == 200
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            for stub in stubs:
                await stub.cleanup()
    ms = [t * 1e3 for t in times]
    print(
        f"requests={len(ms)} body={size}B p50={pct(ms, 0.5):.2f}ms p90={pct(ms, 0.9):.2f}ms "
        f"p99={pct(ms, 0.99):.2f}ms mean={statistics.mean(ms):.2f}ms cores={os.cpu_count()} "
        f"sglang={args.sglang}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
