"""CPU per request of `llmb-loadgen run`'s measured phase against bare aiohttp clients.

The question behind it (issue 20, c=256): does the load generator take CPU the stub needs?
Each run starts a fresh stub (as bench/loadgen_accuracy.py: 200 ms TTFT, 20 ms ITL, its own
process) and one client in its own process, rotating the clients every round:

* **llmb-loadgen**: `cli.loadgen.main(["run", ...])` as `bench/loadgen_accuracy.py`
  runs it (3 x C requests, 20 tokens, requests.jsonl, live /metrics); its CPU is taken around
  the *measured* phase (`EnginePhase.run`), so imports, prompt calibration and pre-opening the pool
  are left out;
* **bare**: the accuracy bench's bare client (asyncio loop), CPU around the whole run (it
  opens its connections in its first wave, a small cost the load generator pays before);
* **bare-uvloop**: the same bare client on uvloop, the loop the load generator runs on;
* **baseline** (`--baseline DIR`): the load generator of another checkout.

Per run: user and system CPU seconds of the client process (`getrusage`) per request, and
the stub's own lateness (p50/p99 over its chunks, its `/stats`). Printed per run and as
medians over rounds.

    .venv/bin/python bench/loadgen_cpu.py [--concurrency 256] [--rounds 5] [--stub-uvloop]
        [--baseline OTHER_CHECKOUT] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Not on sys.path at import: a child measuring another checkout (`--baseline`) must import
# that checkout's loadgen (its PYTHONPATH), not this one's.


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child(kind: str, url: str, concurrency: int, requests: int, tokens: int) -> dict[str, float]:
    """Run one client in this process; its CPU (s) and request count."""
    spent: dict[str, float] = {}

    def account(t0: resource.struct_rusage, number: int) -> None:
        # getrusage, not os.times(): microseconds instead of 10 ms clock ticks.
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        spent.update(user=t1.ru_utime - t0.ru_utime, sys=t1.ru_stime - t0.ru_stime)
        spent["requests"] = number

    if kind.startswith("bare"):
        sys.path.insert(0, str(ROOT))
        from bench.loadgen_accuracy import bare_client

        runner = asyncio.run
        if kind == "bare-uvloop":
            import uvloop

            runner = uvloop.run
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        records = runner(bare_client(url, concurrency, requests))
        account(t0, len(records))
        return spent
    # The load generator of the checkout on PYTHONPATH; only its measured phase is counted.
    from cli.loadgen import main
    from loadgen.scheduler import phase

    plain = phase.EnginePhase.run

    async def timed(self: phase.EnginePhase) -> float:
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        wall = await plain(self)
        if self.measured:
            account(t0, len(self.records))
        return wall

    phase.EnginePhase.run = timed  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["run", "--url", url, "--concurrency", str(concurrency),
                "--requests", str(requests), "--warmup", "0", "--max-tokens", str(tokens),
                "--out", tmp, "--metrics-port", str(_free_port())]  # fmt: skip
        try:
            main(argv)
        except SystemExit as exc:
            if exc.code:
                raise
    return spent


def one_run(kind: str, root: Path, concurrency: int, stub_uvloop: bool) -> dict[str, Any]:
    """One client's run against a fresh stub."""
    from bench.loadgen_accuracy import MAX_TOKENS, with_fresh_stub

    def measure(url: str) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--child", kind, url, str(concurrency),
               str(3 * concurrency), str(MAX_TOKENS)]  # fmt: skip
        env = os.environ | {"PYTHONPATH": str(root)}
        out = subprocess.run(
            cmd, check=True, timeout=600, env=env, cwd=root, capture_output=True, text=True
        )
        spent: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return spent

    spent, load, stats = with_fresh_stub(measure, stub_uvloop)
    number = spent["requests"]
    return {
        "client": kind,
        "requests": number,
        "load_1m": round(load, 2),
        "cpu_us_per_request": round((spent["user"] + spent["sys"]) / number * 1e6),
        "user_us_per_request": round(spent["user"] / number * 1e6),
        "sys_us_per_request": round(spent["sys"] / number * 1e6),
        "stub_late_p50_ms": round(stats["lateness_p50_s"] * 1000, 3),
        "stub_late_p99_ms": round(stats["lateness_p99_s"] * 1000, 3),
    }


def main() -> None:
    """Rotate the clients over the rounds and print per-run rows and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stub-uvloop", action="store_true", help="run the stub on uvloop")
    parser.add_argument("--baseline", type=Path, help="also run this checkout's load generator")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, url, concurrency, requests, tokens = args.child
        print(json.dumps(child(kind, url, int(concurrency), int(requests), int(tokens))))
        return
    sys.path.insert(0, str(ROOT))
    clients: dict[str, Path] = {"llmb-loadgen": ROOT, "bare": ROOT, "bare-uvloop": ROOT}
    if args.baseline:
        clients["baseline"] = args.baseline.resolve()
    rows: list[dict[str, Any]] = []
    names = list(clients)
    for number in range(args.rounds):
        # Rotate, so no client always runs first or right after the same one.
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            kind = "llmb-loadgen" if name == "baseline" else name
            row = one_run(kind, clients[name], args.concurrency, args.stub_uvloop)
            row.update(client=name, round=number, time=time.strftime("%H:%M:%S"))
            rows.append(row)
            print(json.dumps(row), flush=True)
    keys = ("cpu_us_per_request", "user_us_per_request", "sys_us_per_request",
            "stub_late_p50_ms", "stub_late_p99_ms")  # fmt: skip
    medians = {
        name: {k: statistics.median(r[k] for r in rows if r["client"] == name) for k in keys}
        for name in names
    }
    for name, values in medians.items():
        print(name, json.dumps(values))
    if args.json:
        summary = {"concurrency": args.concurrency, "cpus": len(os.sched_getaffinity(0)),
                   "medians": medians, "rows": rows}  # fmt: skip
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
