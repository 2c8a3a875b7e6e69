"""Timing accuracy of `llmb-loadgen run` as a user sees it, against a bare aiohttp client.

The stub (`python -m simulator.stub --ttft 0.2 --itl 0.02`, its own process) sends the first
token of each request 200 ms after it arrived and then one every 20 ms, on an absolute
schedule. Per concurrency (default 16, 64, 256; requests = 3 x concurrency, 20 tokens each),
rounds alternate, in an ABBA order so neither client always goes first, between

* **llmb-loadgen**: the real command line in its own process, `python -m cli.loadgen run --url
  URL --concurrency C --requests N --warmup 0 --max-tokens 20 --out DIR` (default 512-token
  prompt calibrated on the stub, requests.jsonl, live /metrics, progress lines); its numbers
  are read from requests.jsonl (`ttft_s`, `itl_p99_s`): exactly what a user reads;
* **bare**: a minimal aiohttp client in its own process (one `ClientSession`, a semaphore of
  C, one `perf_counter()` per `data:` line, JSON parsed after the stream ended) sending the
  same 512-word prompt, so both processes cost the stub the same.

Per request: *ITL-p99 error* = |p99 of its inter-token gaps - 20 ms| (linear-interpolated,
the same `percentile` as requests.jsonl) and *TTFT error* = TTFT - 200 ms. Reported per client
and round: their p50 and p99 over the requests (ms). The stub's own lateness is in both
clients' errors alike; "excess" = llmb-loadgen - bare, paired per round (median and worst of
the per-round differences), so the machine's noise cancels as far as it can.

    .venv/bin/python bench/loadgen_accuracy.py [--concurrency 16,64,256] [--rounds 4]
        [--baseline OTHER_CHECKOUT] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen_throughput import free_port, start_stub  # noqa: E402
from loadgen.results import percentile  # noqa: E402

TTFT = 0.2
ITL = 0.02
MAX_TOKENS = 20
PROMPT_WORDS = 512
KEYS = (
    "itl_p99_err_p50_ms",
    "itl_p99_err_p99_ms",
    "ttft_err_p50_ms",
    "ttft_err_p99_ms",
    "stub_late_p50_ms",
    "stub_late_p99_ms",
)


def errors_ms(records: list[dict[str, Any]]) -> dict[str, float]:
    """p50/p99 over the requests of |ITL-p99 - nominal| and of TTFT - nominal (ms)."""
    itl = [abs(r["itl_p99_s"] - ITL) * 1000 for r in records if r["itl_p99_s"] is not None]
    ttft = [(r["ttft_s"] - TTFT) * 1000 for r in records if r["ttft_s"] is not None]
    values = (itl, itl, ttft, ttft)
    return {
        key: round(percentile(vals, 50 if "_p50_" in key else 99) or 0.0, 3)
        for key, vals in zip(KEYS, values, strict=False)
    }


async def bare_client(
    url: str,
    concurrency: int,
    requests: int,
    *,
    max_tokens: int = MAX_TOKENS,
    prompt_words: int = PROMPT_WORDS,
    endpoint: str = "chat",
) -> list[dict[str, Any]]:
    """The reference: a bare aiohttp loop, one timestamp per `data:` line.

    Each record: `ttft_s`, `itl_p99_s`, `chunks` (token chunks) and the request's `start_s` /
    `end_s` (perf_counter: CLOCK_MONOTONIC, comparable across processes on Linux)."""
    import aiohttp

    prompt = " ".join(f"w{i}" for i in range(prompt_words))
    request: dict[str, Any] = {"model": "m", "max_tokens": max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}}  # fmt: skip
    if endpoint == "chat":
        request["messages"] = [{"role": "user", "content": prompt}]
        path, token = "/v1/chat/completions", b'"content":"'
    else:
        request["prompt"] = prompt
        # The stub's token chunks are the ones that have not finished (usage, end: finished).
        path, token = "/v1/completions", b'"finish_reason":null'
    body = json.dumps(request).encode()
    sem = asyncio.Semaphore(concurrency)
    out: list[dict[str, Any]] = []
    perf = time.perf_counter

    async def one(session: aiohttp.ClientSession) -> None:
        async with sem:
            lines: list[tuple[float, bytes]] = []
            t0 = perf()
            async with session.post(url + path, data=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        lines.append((perf(), line))
            t1 = perf()
        stamps = [t for t, line in lines if token in line]
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        out.append(
            {"ttft_s": stamps[0] - t0 if stamps else None, "itl_p99_s": percentile(gaps, 99),
             "chunks": len(stamps), "start_s": t0, "end_s": t1}
        )  # fmt: skip

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session) for _ in range(requests)))
    return out


def run_bare(
    url: str, concurrency: int, requests: int, *, max_tokens: int = MAX_TOKENS,
    prompt_words: int = PROMPT_WORDS, endpoint: str = "chat",
) -> list[dict[str, Any]]:  # fmt: skip
    """The bare client in its own process (as the load generator runs in its own)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bare.json"
        cmd = [sys.executable, __file__, "--bare", url, "--concurrency", str(concurrency),
               "--requests", str(requests), "--json", str(out),
               "--bare-shape", str(max_tokens), str(prompt_words), endpoint]  # fmt: skip
        subprocess.run(cmd, check=True, timeout=600)
        records: list[dict[str, Any]] = json.loads(out.read_text())
    return records


def run_loadgen(
    url: str, concurrency: int, requests: int, root: Path = ROOT
) -> list[dict[str, Any]]:
    """`llmb-loadgen run` (of the checkout `root`) in its own process; its requests.jsonl."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "cli.loadgen", "run", "--url", url,
               "--concurrency", str(concurrency), "--requests", str(requests), "--warmup", "0",
               "--max-tokens", str(MAX_TOKENS), "--out", tmp,
               "--metrics-port", str(free_port())]  # fmt: skip
        # The checkout first, then whatever the caller's PYTHONPATH holds (the device machine
        # brings some dependencies there).
        path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
        env = os.environ | {"PYTHONPATH": path}
        done = subprocess.run(
            cmd, timeout=600, env=env, stdout=subprocess.DEVNULL, cwd=root,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        if done.returncode:
            raise SystemExit(f"llmb-loadgen exited {done.returncode}:\n{done.stderr[-2000:]}")
        lines = (Path(tmp) / "requests.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["error"] is None]


Client = Callable[[str, int, int], list[dict[str, Any]]]
CLIENTS: dict[str, Client] = {"bare": run_bare, "llmb-loadgen": run_loadgen}


# `--stub-uvloop`: the stub on uvloop's event loop. At concurrency 256 the single-threaded
# stub on asyncio's loop needs most of a core (12 800 chunks/s) and its own lateness then
# swamps any client's; uvloop roughly halves its cost per chunk.
STUB_UVLOOP: list[str] = []
_UVLOOP_STUB = (
    "import sys, uvloop, asyncio; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); "
    "from simulator.stub import main; main(sys.argv[1:])"
)


def with_fresh_stub(
    run: Callable[[str], Any], uvloop: bool, delays: tuple[float, float] | None = (TTFT, ITL)
) -> tuple[Any, float, dict[str, Any]]:
    """`run(url)` against a fresh stub: its result, the 1-minute load average at the start and
    the stub's /stats afterwards (its own lateness). `delays`: (TTFT, ITL) in seconds, None
    for the zero-delay stub (each response written at once)."""
    port = free_port()
    args = ("--ttft", str(delays[0]), "--itl", str(delays[1])) if delays else ()
    stub = start_stub(port, *args, module=["-c", _UVLOOP_STUB] if uvloop else None)
    url = f"http://127.0.0.1:{port}"
    try:
        load = os.getloadavg()[0]
        result = run(url)
        with urllib.request.urlopen(url + "/stats", timeout=10) as resp:
            stats = json.load(resp)
    finally:
        stub.terminate()
        stub.wait(10)
    return result, load, stats


def one_run(name: str, concurrency: int, number: int) -> dict[str, Any]:
    """One client's run against a fresh stub, whose /stats then give its own lateness."""
    records, load, stats = with_fresh_stub(
        lambda url: CLIENTS[name](url, concurrency, 3 * concurrency), bool(STUB_UVLOOP)
    )
    return {
        "concurrency": concurrency,
        "round": number,
        "client": name,
        "requests": len(records),
        "load_1m": round(load, 2),
        **errors_ms(records),
        # How late the stub itself woke up for its chunks (the same for both clients on an
        # idle machine; a client that takes the stub's CPU makes it larger).
        "stub_late_p50_ms": round(stats["lateness_p50_s"] * 1000, 3),
        "stub_late_p99_ms": round(stats["lateness_p99_s"] * 1000, 3),
    }


def one_concurrency(concurrency: int, rounds: int) -> dict[str, Any]:
    """Alternate the clients (ABBA: the order reverses every round) at one concurrency."""
    rows: list[dict[str, Any]] = []
    for number in range(rounds):
        order = list(CLIENTS) if number % 2 == 0 else list(reversed(CLIENTS))
        for name in order:
            rows.append(one_run(name, concurrency, number))
            print(json.dumps(rows[-1]), flush=True)
    return {"concurrency": concurrency, "rounds": rows, **paired(rows)}


def paired(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per client and the per-round excess of llmb-loadgen over bare."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["client"]] = row
    median = {
        name: {key: sorted(r[key] for r in rows if r["client"] == name)[len(by_round) // 2]
               for key in KEYS}
        for name in CLIENTS
    }  # fmt: skip
    out: dict[str, Any] = {"median": median}
    for name in CLIENTS:
        if name == "bare":
            continue
        diffs = {key: sorted(r[name][key] - r["bare"][key] for r in by_round.values())
                 for key in KEYS}  # fmt: skip
        out[name] = {
            "excess_median_ms": {k: round(v[len(v) // 2], 3) for k, v in diffs.items()},
            "excess_worst_ms": {k: round(v[-1], 3) for k, v in diffs.items()},
        }
    return out


def main() -> None:
    """Run the rounds at each concurrency and print (and optionally save) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="16,64,256", help="comma list")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per client")
    parser.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bare", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--bare-shape", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--stub-uvloop", action="store_true", help="run the stub on uvloop (for c=256)"
    )
    parser.add_argument(
        "--baseline", type=Path, help="also run the load generator of this checkout (before/after)"
    )
    args = parser.parse_args()
    if args.bare:
        tokens, words, endpoint = args.bare_shape or (MAX_TOKENS, PROMPT_WORDS, "chat")
        records = asyncio.run(
            bare_client(args.bare, int(args.concurrency), args.requests, max_tokens=int(tokens),
                        prompt_words=int(words), endpoint=endpoint)
        )  # fmt: skip
        args.json.write_text(json.dumps(records))
        return
    if args.stub_uvloop:
        STUB_UVLOOP.append("uvloop")
    if args.baseline:
        base = args.baseline.resolve()
        CLIENTS["baseline"] = lambda u, c, n: run_loadgen(u, c, n, base)
    results = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        results.append(one_concurrency(concurrency, args.rounds))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "rounds"}), flush=True)
    summary = {"cpus": len(os.sched_getaffinity(0)), "load_avg": os.getloadavg(),
               "results": results}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
