"""Throughput of the load generator itself against a zero-delay streaming stub.

The stub (`python -m simulator.stub`, zero-delay mode: each response pre-rendered and written at
once) runs in a separate process; the load generator runs in this one, through the same code
path as `llmb-loadgen run` (calibration skipped with a fixed prompt, requests.jsonl written and
flushed per request, live metrics on). Two shapes:

* short: 1 token per request -> requests/s (target >= 3000)
* long: 256 tokens per request -> streamed chunks/s (target >= 100 000)

With `--sglang-python PY` (the interpreter of a separate virtualenv holding PyPI `sglang`
installed `--no-deps` plus the few packages its benchmark imports) the same shapes are also
sent by SGLang's `bench_serving`, run through bench/loadgen_sglang_shim.py, against the same
stub in the same run, alternating with the load generator.

    .venv/bin/python bench/loadgen_throughput.py [--workers N] [--sglang-python VENV/bin/python]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from loadgen.scheduler.spec import RunSpec  # noqa: E402
from loadgen.session import SessionOptions, execute, run  # noqa: E402
from loadgen.target import Target  # noqa: E402
from loadgen.workers import execute_workers  # noqa: E402


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_stub(port: int, *extra: str, module: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start the stub in its own process and wait until it answers.

    `module`: how to start it instead of `-m simulator.stub` (e.g. `-c CODE`).
    """
    start = module or ["-m", "simulator.stub"]
    proc = subprocess.Popen(
        [sys.executable, *start, "--port", str(port), "--no-keep", *extra],
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


async def measure(
    url: str, requests: int, max_tokens: int, concurrency: int, workers: int = 1
) -> dict[str, Any]:
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
        # Client CPU: this process plus its (joined) worker processes; the stub is not waited
        # for until the end, so it is not counted here.
        cpu0 = _cpu_seconds()
        if workers > 1:
            result = await execute_workers(spec, options, workers, log_level="WARNING")
        else:
            result = await execute([spec], options)
        cpu = _cpu_seconds() - cpu0
        step = result.summary.steps[0].to_dict()
        lines = (Path(tmp) / "requests.jsonl").read_text().splitlines()
        chunks = sum(json.loads(x)["chunks"] for x in lines)
    wall = step["wall_s"]
    return {
        "tool": "llmb-loadgen" if workers == 1 else f"llmb-loadgen --workers {workers}",
        "requests": step["requests"],
        "failed": step["requests_failed"],
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "requests_per_s": round(step["requests"] / wall, 1),
        "chunks_per_s": round(chunks / wall, 1),
        "client_cpu_s": round(cpu, 2),
    }


def _cpu_seconds() -> float:
    """CPU seconds used by this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure_sglang(
    python: str, url: str, requests: int, max_tokens: int, concurrency: int, tokenizer: Path
) -> dict[str, Any]:
    """The same shape sent by SGLang's bench_serving (its own process)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.jsonl"
        cmd = [
            python, str(ROOT / "bench" / "loadgen_sglang_shim.py"),
            "--backend", "sglang-oai-chat", "--base-url", url, "--model", "stub-model",
            "--tokenizer", str(tokenizer), "--dataset-name", "random-ids",
            "--random-input-len", "16", "--random-output-len", str(max_tokens),
            "--random-range-ratio", "1.0", "--num-prompts", str(requests),
            "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--warmup-requests", str(concurrency), "--disable-tqdm", "--output-file", str(out),
        ]  # fmt: skip
        # Offline: bench_serving must never reach for the Hugging Face hub.
        env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=900)
        data = json.loads(out.read_text().splitlines()[-1])
    wall = float(data["duration"])
    return {
        "tool": "sglang.bench_serving",
        "requests": data["completed"],
        "failed": requests - int(data["completed"]),
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "requests_per_s": round(data["completed"] / wall, 1),
        "chunks_per_s": round(data["completed"] * max_tokens / wall, 1),
    }


def main() -> None:
    """Run both shapes and print (and optionally save) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--short-requests", type=int, default=20000)
    parser.add_argument("--long-requests", type=int, default=1500)
    parser.add_argument("--long-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="runs per shape; the best is kept")
    parser.add_argument(
        "--workers", type=int, default=1, help="load-generator worker processes (--workers)"
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--sglang-python", help="interpreter of a venv with sglang (compare)")
    args = parser.parse_args()
    port = free_port()
    stub = start_stub(port)
    url = f"http://127.0.0.1:{port}"
    results: list[dict[str, Any]] = []
    tmp = tempfile.TemporaryDirectory()
    tokenizer = Path(tmp.name) / "tokenizer"
    if args.sglang_python:
        script = str(ROOT / "bench" / "loadgen_sglang_shim.py")
        subprocess.run(
            [args.sglang_python, script, "--make-tokenizer", str(tokenizer)],
            check=True,
            stderr=subprocess.DEVNULL,
        )
    try:
        for requests, tokens in ((args.short_requests, 1), (args.long_requests, args.long_tokens)):
            key = "requests_per_s" if tokens == 1 else "chunks_per_s"
            runs: dict[str, list[dict[str, Any]]] = {}
            for _ in range(args.repeat):
                # Alternate the tools so a change in machine load hits both alike.
                row = run(measure(url, requests, tokens, args.concurrency, args.workers))
                runs.setdefault(row["tool"], []).append(row)
                if args.sglang_python:
                    row = measure_sglang(
                        args.sglang_python, url, requests, tokens, args.concurrency, tokenizer
                    )
                    runs.setdefault(row["tool"], []).append(row)
            for rows in runs.values():
                best = max(rows, key=lambda r: r[key])
                best["runs"] = [r[key] for r in rows]
                results.append(best)
                print(json.dumps(best), flush=True)
    finally:
        stub.terminate()
        stub.wait(10)
        tmp.cleanup()
    info = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "results": results}
    if args.json:
        args.json.write_text(json.dumps(info, indent=2) + "\n")


if __name__ == "__main__":
    main()
