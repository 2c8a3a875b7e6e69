"""How well a trace replay keeps its schedule: `llmb-loadgen run --traffic` beside AIPerf's
fixed-schedule replay of the same Mooncake trace (issue 34: within 5 ms at p99, 50 req/s).

The trace (written here, seeded): `--requests` requests at Poisson arrivals of `--rate` per
second, 64-token prompts, 8-token answers. Each round starts a fresh stub (`python -m
simulator.stub --ttft 0.05 --itl 0.01`, its own process, so answers overlap and the replay
must not wait for them) and one tool in its own process; the tools alternate (ABBA).

Per request, from each tool's *own* records (bench/peer_tools.py reads AIPerf's):
send error = (its start - the first request's start) - (its trace offset - the first's), in
ms; reported per tool and round at p50, p99 and the worst. llmb-loadgen's own `send_error_s`
(the request handed to the socket less its scheduled time) is reported beside it.

    .venv/bin/python bench/traffic_timing.py [--rate 50] [--requests 500] [--rounds 2]
        [--tools llmb-loadgen,aiperf] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen_accuracy import with_fresh_stub  # noqa: E402
from bench.loadgen_throughput import free_port  # noqa: E402
from bench.peer_tools import MODEL, OFFLINE, TOKENIZER_REPO, make_tokenizer  # noqa: E402
from bench.peer_venvs import PEERS, missing_reason  # noqa: E402
from loadgen.results import percentile  # noqa: E402

PROMPT_TOKENS = 64
OUTPUT_TOKENS = 8
DELAYS = (0.05, 0.01)


def write_trace(path: Path, rate: float, count: int, seed: int = 34) -> list[float]:
    """A Mooncake trace of `count` requests at Poisson arrivals; their offsets in seconds."""
    rng = random.Random(seed)
    at, offsets, lines = 0.0, [], []
    for i in range(count):
        offsets.append(round(at * 1000) / 1000)
        row = {"timestamp": round(at * 1000), "input_length": PROMPT_TOKENS,
               "output_length": OUTPUT_TOKENS, "hash_ids": [i]}  # fmt: skip
        lines.append(json.dumps(row))
        at += rng.expovariate(rate)
    path.write_text("\n".join(lines) + "\n")
    return offsets


def run_llmb(url: str, trace: Path, work: Path) -> tuple[list[float], list[float]]:
    """llmb-loadgen's start times (unix s, trace order) and its own send errors."""
    out = work / "out"
    cmd = [sys.executable, "-m", "cli.loadgen", "run", "--url", url, "--endpoint",
           "completions", "--traffic", str(trace), "--out", str(out), "--metrics-port",
           str(free_port()), "--no-progress"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    rows = sorted(
        (json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()),
        key=lambda r: r["index"],
    )
    return [r["start_time"] for r in rows], [r["send_error_s"] for r in rows]


def run_aiperf(url: str, trace: Path, work: Path, tokenizer: Path) -> list[float]:
    """AIPerf's request start times (unix s, in trace order) of its fixed-schedule replay."""
    peer = PEERS["aiperf"]
    cmd = [str(peer.executable), "profile", "--model", MODEL, "--tokenizer", TOKENIZER_REPO,
           "--url", url, "--endpoint-type", "completions", "--streaming",
           "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
           "--fixed-schedule", "--extra-inputs", "ignore_eos:true", "--random-seed", "1",
           "--artifact-dir", str(work / "artifacts"), "--ui-type", "none",
           "--no-server-metrics", "--no-gpu-telemetry"]  # fmt: skip
    env = os.environ | OFFLINE | {"HF_HOME": str(tokenizer.parent / "hf"), "TMPDIR": str(work)}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    starts = []
    for line in (work / "artifacts" / "profile_export.jsonl").read_text().splitlines():
        meta = json.loads(line)["metadata"]
        starts.append(meta["request_start_ns"] / 1e9)
    return sorted(starts)


def errors_ms(starts: list[float], offsets: list[float]) -> list[float]:
    """Each request's start against its schedule, both from the first request (ms)."""
    return [
        1000 * ((s - starts[0]) - (o - offsets[0])) for s, o in zip(starts, offsets, strict=True)
    ]


def figures(errors: list[float]) -> dict[str, float]:
    """p50, p99 and the worst of the send errors (ms)."""
    return {
        "err_p50_ms": round(percentile(errors, 50) or 0.0, 3),
        "err_p99_ms": round(percentile(errors, 99) or 0.0, 3),
        "err_max_ms": round(max(errors), 3),
    }


def one_round(
    tool: str, trace: Path, offsets: list[float], work: Path, tokenizer: Path | None
) -> dict[str, Any]:
    """One tool's replay against a fresh stub."""
    work.mkdir(parents=True)
    row: dict[str, Any] = {"tool": tool}
    if tool == "llmb-loadgen":
        (starts, own), load, _stats = with_fresh_stub(
            lambda url: run_llmb(url, trace, work), False, DELAYS
        )
        row |= {"own_send_error_p99_ms": round(1000 * (percentile(own, 99) or 0.0), 3)}
    else:
        assert tokenizer is not None
        starts, load, _stats = with_fresh_stub(
            lambda url: run_aiperf(url, trace, work, tokenizer), False, DELAYS
        )
    row |= {"requests": len(starts), "load_1m": round(load, 2)}
    if len(starts) == len(offsets):
        row |= figures(errors_ms(starts, offsets))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tools", default="llmb-loadgen,aiperf")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tools = args.tools.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="traffic-timing-") as tmp:
        work = Path(tmp)
        trace = work / "trace.jsonl"
        offsets = write_trace(trace, args.rate, args.requests)
        tokenizer = None
        if "aiperf" in tools:
            reason = missing_reason(PEERS["aiperf"])
            if reason:
                sys.exit(f"aiperf: {reason}")
            tokenizer = make_tokenizer(work)
        for number in range(args.rounds):
            order = tools if number % 2 == 0 else tools[::-1]
            for tool in order:
                row = one_round(tool, trace, offsets, work / f"{tool}-{number}", tokenizer)
                row |= {"round": number, "rate": args.rate, "at": time.strftime("%H:%M:%S")}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
