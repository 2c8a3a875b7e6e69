"""Throughput of the load generator itself against a zero-delay streaming stub.

The stub (`python -m loadgen.stub`, zero-delay mode: each response pre-rendered and written at
once) runs in a separate process; the load generator runs in this one, through the same code
path as `llmb-loadgen run` (calibration skipped with a fixed prompt, requests.jsonl written and
flushed per request, live metrics on). Two shapes:

* short: 1 token per request -> requests/s (target >= 3000)
* long: 256 tokens per request -> streamed chunks/s (target >= 100 000)

With `--compare-python PY` the same shapes are also sent by a published load tool installed
in another virtualenv (see docs/benchmarks.md for what could be installed here).

    .venv/bin/python bench/loadgen_throughput.py [--concurrency 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadgen.client import Target  # noqa: E402
from loadgen.scheduler import RunSpec  # noqa: E402
from loadgen.session import SessionOptions, execute  # noqa: E402


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_stub(port: int, *extra: str) -> subprocess.Popen[bytes]:
    """Start the stub in its own process and wait until it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen.stub", "--port", str(port), "--no-keep", *extra],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("stub did not start")


async def measure(url: str, requests: int, max_tokens: int, concurrency: int) -> dict[str, Any]:
    """One run through `execute` (the CLI's code path); returns the rates it achieved."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = RunSpec(
            targets=[Target("stub", url)],
            max_tokens=max_tokens,
            concurrency=concurrency,
            requests=requests,
            prompt_text="Explain the memory hierarchy of a GPU.",
            warmup=concurrency,
        )
        options = SessionOptions(
            out_dir=Path(tmp), metrics_port=free_port(), metrics_host="127.0.0.1",
            progress=False, print_table=False,
        )  # fmt: skip
        result = await execute([spec], options)
        step = result.summary["steps"][0]
        lines = (Path(tmp) / "requests.jsonl").read_text().splitlines()
        chunks = sum(json.loads(x)["chunks"] for x in lines)
    wall = step["wall_s"]
    return {
        "tool": "llmb-loadgen",
        "requests": step["requests"],
        "failed": step["requests_failed"],
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "requests_per_s": round(step["requests"] / wall, 1),
        "chunks_per_s": round(chunks / wall, 1),
    }


def main() -> None:
    """Run both shapes and print (and optionally save) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--short-requests", type=int, default=20000)
    parser.add_argument("--long-requests", type=int, default=1500)
    parser.add_argument("--long-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="runs per shape; the best is kept")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    port = free_port()
    stub = start_stub(port)
    url = f"http://127.0.0.1:{port}"
    results: list[dict[str, Any]] = []
    try:
        for requests, tokens in ((args.short_requests, 1), (args.long_requests, args.long_tokens)):
            runs = [
                asyncio.run(measure(url, requests, tokens, args.concurrency))
                for _ in range(args.repeat)
            ]
            key = "requests_per_s" if tokens == 1 else "chunks_per_s"
            best = max(runs, key=lambda r: r[key])
            best["runs"] = [r[key] for r in runs]
            results.append(best)
            print(json.dumps(best), flush=True)
    finally:
        stub.terminate()
        stub.wait(10)
    info = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "results": results}
    if args.json:
        args.json.write_text(json.dumps(info, indent=2) + "\n")


if __name__ == "__main__":
    main()
