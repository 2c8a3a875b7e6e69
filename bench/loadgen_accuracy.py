"""Timing accuracy of the load generator at concurrency 64 against a stub with known delays.

The stub (`python -m loadgen.stub --ttft 0.2 --itl 0.02`, its own process, pinned to the last
CPU) sends token k of each request at the absolute deadline arrival + 200 ms + k * 20 ms and
reports how late each chunk really left (`/stats`). In the same run, alternating rounds of

* the load generator (`execute`, the CLI's code path: metrics, requests.jsonl, progress), and
* a minimal reference client (a bare aiohttp streaming loop, pre-opened connections)

measure TTFT and inter-token gaps; the error is measured minus nominal (200 ms, 20 ms).

    .venv/bin/python bench/loadgen_accuracy.py [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen_throughput import free_port, start_stub  # noqa: E402
from loadgen.client import Target  # noqa: E402
from loadgen.results import percentile  # noqa: E402
from loadgen.scheduler import RunSpec  # noqa: E402
from loadgen.session import SessionOptions, execute  # noqa: E402

TTFT = 0.2
ITL = 0.02


def errors_ms(ttfts: list[float], gaps: list[float]) -> dict[str, float]:
    """p50/p99 of (measured - nominal) in milliseconds."""
    ttft_err = [(t - TTFT) * 1000 for t in ttfts]
    itl_err = [(g - ITL) * 1000 for g in gaps]
    return {
        "ttft_err_p50_ms": round(percentile(ttft_err, 50) or 0.0, 3),
        "ttft_err_p99_ms": round(percentile(ttft_err, 99) or 0.0, 3),
        "itl_err_p50_ms": round(percentile(itl_err, 50) or 0.0, 3),
        "itl_err_p99_ms": round(percentile(itl_err, 99) or 0.0, 3),
    }


async def reference(url: str, requests: int, max_tokens: int, concurrency: int) -> dict[str, Any]:
    """A bare aiohttp streaming loop: stamp each network read that holds a token event."""
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Explain the memory hierarchy of a GPU."}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    ttfts: list[float] = []
    gaps: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            t0 = time.perf_counter()
            stamps = []
            async with session.post(url + "/v1/chat/completions", data=body) as resp:
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    stamps += [now] * data.count(b'"content":" t')
            ttfts.append(stamps[0] - t0)
            gaps.extend(b - a for a, b in itertools.pairwise(stamps))

        # Pre-open the connections, as the load generator does.
        await asyncio.gather(*(session.get(url + "/v1/models") for _ in range(concurrency)))
        left = [requests]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await one()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"client": "reference", "requests": len(ttfts), **errors_ms(ttfts, gaps)}


async def ours(url: str, requests: int, max_tokens: int, concurrency: int) -> dict[str, Any]:
    """The load generator through `execute`, exactly as `llmb-loadgen run` drives it."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = RunSpec(
            targets=[Target("stub", url)],
            max_tokens=max_tokens,
            concurrency=concurrency,
            requests=requests,
            prompt_text="Explain the memory hierarchy of a GPU.",
        )
        options = SessionOptions(
            out_dir=Path(tmp), metrics_port=free_port(), metrics_host="127.0.0.1",
            progress=False, print_table=False,
        )  # fmt: skip
        result = await execute([spec], options)
    records = result.steps[0].records["stub"]
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    gaps = [g for r in records for g in r.itls]
    return {"client": "llmb-loadgen", "requests": len(records), **errors_ms(ttfts, gaps)}


def stub_stats(url: str) -> dict[str, Any]:
    """The stub's own lateness figures (seconds)."""
    with urllib.request.urlopen(url + "/stats", timeout=5) as resp:
        data: dict[str, Any] = json.load(resp)
    return data


def main() -> None:
    """Alternate rounds of both clients and print the per-round and median errors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=192, help="per round and client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        # Stub on the last CPU, clients on the others: they never share a core's run queue.
        os.sched_setaffinity(0, cpus[:-1])
    port = free_port()
    stub = start_stub(port, "--ttft", str(TTFT), "--itl", str(ITL))
    if len(cpus) > 1:
        os.sched_setaffinity(stub.pid, cpus[-1:])
    url = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    try:
        for number in range(args.rounds):
            for client in (reference, ours):
                row = asyncio.run(client(url, args.requests, args.max_tokens, args.concurrency))
                row["round"] = number
                rows.append(row)
                print(json.dumps(row), flush=True)
        stats = stub_stats(url)
    finally:
        stub.terminate()
        stub.wait(10)
    summary: dict[str, Any] = {"stub": stats, "rounds": rows, "median": {}}
    for name in ("reference", "llmb-loadgen"):
        mine = [r for r in rows if r["client"] == name]
        summary["median"][name] = {
            key: sorted(r[key] for r in mine)[len(mine) // 2]
            for key in ("ttft_err_p50_ms", "ttft_err_p99_ms", "itl_err_p50_ms", "itl_err_p99_ms")
        }
    ref, own = summary["median"]["reference"], summary["median"]["llmb-loadgen"]
    summary["excess_ms"] = {key: round(own[key] - ref[key], 3) for key in own}
    print(
        json.dumps({"stub": stats, "median": summary["median"], "excess_ms": summary["excess_ms"]})
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
