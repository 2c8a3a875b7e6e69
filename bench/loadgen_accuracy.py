"""Timing accuracy of the load generator at concurrency 64 against a stub with known delays.

The stub (`python -m loadgen.stub --ttft 0.2 --itl 0.02 --report-sends`, its own process)
sends token k of each request at arrival + 200 ms + k * 20 ms and writes, into the usage
chunk, the request's arrival and the moment each token really left (`perf_counter`, which is
CLOCK_MONOTONIC on Linux and so one clock for both processes). The true TTFT of a request is
then `sent[0] - arrival` and its true gaps `sent[k] - sent[k-1]`, whatever the stub's own
lateness on a busy machine; a client's error is what it measured minus that truth:

* TTFT error per request (p50 and p99 over the requests);
* ITL error: each request's p99 inter-token gap minus the true one, p50 and p99 over the
  requests (the figure issue 11 states), and every single gap's error (p50/p99).

In the same run, alternating rounds of

* the load generator (`execute`, the CLI's code path: live metrics server, requests.jsonl,
  progress accounting), and
* a minimal reference client (a bare aiohttp streaming loop, pre-opened connections, one
  `perf_counter()` per network read)

are measured, so the comparison shares the machine's noise. The load generator's raw
per-request results are captured by a subclass of its client that only keeps a reference to
each result (no work per chunk).

    .venv/bin/python bench/loadgen_accuracy.py [--rounds 5] [--workers N] [--json OUT]
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
from typing import Any, ClassVar

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen_throughput import free_port, start_stub  # noqa: E402
from loadgen import scheduler  # noqa: E402
from loadgen.client import StreamClient, StreamResult, Target  # noqa: E402
from loadgen.results import percentile  # noqa: E402
from loadgen.scheduler import RunSpec  # noqa: E402
from loadgen.session import SessionOptions, execute  # noqa: E402

TTFT = 0.2
ITL = 0.02
KEYS = (
    "ttft_err_p50_ms",
    "ttft_err_p99_ms",
    "itl_p99_err_p50_ms",
    "itl_p99_err_p99_ms",
    "gap_err_p50_ms",
    "gap_err_p99_ms",
)


class Sample:
    """One request: the client's send time and chunk stamps, the stub's truth."""

    def __init__(self, t_send: float, stamps: list[float], arrival: float, sent: list[float]):
        self.t_send, self.stamps, self.arrival, self.sent = t_send, stamps, arrival, sent


def errors_ms(samples: list[Sample]) -> dict[str, float]:
    """p50/p99 of measured minus true TTFT, per-request ITL p99 and single gaps (ms)."""
    ttft_err: list[float] = []
    p99_err: list[float] = []
    gap_err: list[float] = []
    for s in samples:
        if not s.stamps or len(s.stamps) != len(s.sent):
            continue
        ttft_err.append(((s.stamps[0] - s.t_send) - (s.sent[0] - s.arrival)) * 1000)
        measured = [b - a for a, b in itertools.pairwise(s.stamps)]
        true = [b - a for a, b in itertools.pairwise(s.sent)]
        if measured:
            p99_err.append(((percentile(measured, 99) or 0) - (percentile(true, 99) or 0)) * 1000)
            gap_err += [(m - t) * 1000 for m, t in zip(measured, true, strict=True)]
    values = (ttft_err, ttft_err, p99_err, p99_err, gap_err, gap_err)
    return {
        key: round(percentile(vals, 50 if key.endswith("p50_ms") else 99) or 0.0, 3)
        for key, vals in zip(KEYS, values, strict=True)
    }


def _truth(body: bytes) -> tuple[float, list[float]]:
    """The stub's arrival and send times from the last `timings` of a stream body."""
    at = body.rfind(b'"timings":')
    start = body.rfind(b"data: ", 0, at) + len(b"data: ")
    end = body.find(b"\n\n", at)
    timings = orjson.loads(body[start:end])["timings"]
    return float(timings["arrival"]), [float(t) for t in timings["sent"]]


def _body(max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Explain the memory hierarchy of a GPU."}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def reference(url: str, requests: int, max_tokens: int, concurrency: int) -> dict[str, Any]:
    """A bare aiohttp streaming loop: stamp each network read that holds a token event."""
    body = _body(max_tokens)
    samples: list[Sample] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            t0 = time.perf_counter()
            stamps: list[float] = []
            parts: list[bytes] = []
            async with session.post(url + "/v1/chat/completions", data=body) as resp:
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    stamps += [now] * data.count(b'"content":" t')
                    parts.append(data)
            arrival, sent = _truth(b"".join(parts))
            samples.append(Sample(t0, stamps, arrival, sent))

        # Pre-open the connections, as the load generator does.
        await asyncio.gather(*(session.get(url + "/v1/models") for _ in range(concurrency)))
        left = [requests]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await one()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"client": "reference", "requests": len(samples), **errors_ms(samples)}


class CapturingClient(StreamClient):
    """The load generator's client, keeping each raw result for the comparison."""

    results: ClassVar[list[StreamResult]] = []

    async def stream(self, body: bytes, timeout: float, parse: bool = True) -> StreamResult:
        result = await super().stream(body, timeout, parse)
        CapturingClient.results.append(result)
        return result


async def ours(url: str, requests: int, max_tokens: int, concurrency: int) -> dict[str, Any]:
    """The load generator through `execute`, exactly as `llmb-loadgen run` drives it."""
    CapturingClient.results = []
    original = scheduler.StreamClient
    scheduler.StreamClient = CapturingClient  # type: ignore[misc]
    try:
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
            await execute([spec], options)
    finally:
        scheduler.StreamClient = original  # type: ignore[misc]
    samples = []
    for r in CapturingClient.results:
        if r.error is None and r.timings and "sent" in r.timings:
            samples.append(Sample(r.t_send, r.chunk_times, r.timings["arrival"], r.timings["sent"]))
    return {"client": "llmb-loadgen", "requests": len(samples), **errors_ms(samples)}


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
    port = free_port()
    stub = start_stub(port, "--ttft", str(TTFT), "--itl", str(ITL), "--report-sends")
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
            key: sorted(r[key] for r in mine)[len(mine) // 2] for key in KEYS
        }
    ref, own = summary["median"]["reference"], summary["median"]["llmb-loadgen"]
    summary["excess_ms"] = {key: round(own[key] - ref[key], 3) for key in KEYS}
    # Paired per round (both clients ran back to back), the median of the differences.
    pairs = list(zip(rows[0::2], rows[1::2], strict=True))
    summary["paired_excess_ms"] = {
        key: sorted(round(o[key] - r[key], 3) for r, o in pairs)[len(pairs) // 2] for key in KEYS
    }
    summary["cpus"] = len(os.sched_getaffinity(0))
    summary["load_avg"] = os.getloadavg()
    print(
        json.dumps(
            {
                "stub": stats,
                "median": summary["median"],
                "excess_ms": summary["excess_ms"],
                "paired_excess_ms": summary["paired_excess_ms"],
                "load_avg": summary["load_avg"],
            }
        )
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
