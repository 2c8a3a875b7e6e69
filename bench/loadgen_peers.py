"""llmb-loadgen against AIPerf and inference-perf (and the bare aiohttp client), side by side.

Every run starts a fresh stub (`python -m simulator.stub`, its own process) and one tool in its
own process (bench/peer_tools.py: the real command lines, `/v1/completions` streaming,
`ignore_eos`, fixed prompt and output lengths, closed loop, no warm-up); the tools rotate every
round, so none always goes first. Shapes:

* `short`: zero-delay stub, c=64, 1-token requests (the bench_serving comparison's shape);
* `long`: zero-delay stub, c=64, 256-token streams;
* `timing-C`: the stub sends the first token 200 ms after a request arrived and one every
  20 ms after (absolute schedule), 20 tokens, 3 x C requests, C = 64 and 256. There, the
  `-ramp` variants of llmb-loadgen and AIPerf also start their C requests over 0.1 s
  (bench/peer_tools.RAMP_S, each tool's own ramp flag), and `llmb-loadgen-paced` offers the
  load of inference-perf's `concurrent` mode.

Per tool, shape and round, from the tool's *own* per-request records:

* requests/s and chunks/s: requests (content chunks) over the span from the first request sent
  to the last one finished;
* CPU per request: user + system CPU of the tool's whole process tree (sampled from /proc
  every 20 ms, interpolated) over that same span, so each tool's start-up, dataset building
  and report writing are left out alike; and from the first request to the tool's exit
  (`cpu_to_exit_us_per_request`: adds the work a tool defers past its last response);
* timing shapes: per request |ITL-p99 - 20 ms| and TTFT - 200 ms, their p50 and p99 over the
  requests (ms; bench/loadgen_accuracy.errors_ms), and the stub's own lateness.

Peers run from their own venvs (bench/peer_venvs.py, made by scripts/install-peers.sh), with a
word-level tokenizer made locally and Hugging Face offline: nothing is downloaded.

    .venv/bin/python bench/loadgen_peers.py [--rounds 3] [--short-requests 4000]
        [--long-requests 400] [--timing-concurrency 64,256] [--tools ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen_accuracy import ITL, TTFT, errors_ms, with_fresh_stub  # noqa: E402
from bench.peer_tools import (  # noqa: E402
    PEER_TOOLS,
    TOOLS,
    VENV_OF,
    Shape,
    make_tokenizer,
    versions,
)
from bench.peer_venvs import PEERS, missing_reason, peers_root  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
RATE_KEYS = ("requests_per_s", "chunks_per_s", "cpu_us_per_request", "cpu_to_exit_us_per_request")
ERROR_KEYS = ("ttft_err_p50_ms", "ttft_err_p99_ms", "itl_p99_err_p50_ms", "itl_p99_err_p99_ms")


def tree_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of a process and all its descendants, live and reaped;
    None once the process itself is gone."""
    if not Path(f"/proc/{pid}").exists():
        return None
    total, stack = 0, [pid]
    while stack:
        proc = stack.pop()
        try:
            stat = Path(f"/proc/{proc}/stat").read_text()
            tasks = os.listdir(f"/proc/{proc}/task")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        for task in tasks:
            try:
                kids = Path(f"/proc/{proc}/task/{task}/children").read_text().split()
            except OSError:
                continue
            stack.extend(int(k) for k in kids)
    return total / CLK_TCK


class CpuSampler(threading.Thread):
    """Samples a process tree's CPU every `interval` s: (unix time, CPU s) pairs."""

    def __init__(self, pid: int, interval: float = 0.02):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            now, cpu = time.time(), tree_cpu(self.pid)
            if cpu is not None:
                self.samples.append((now, cpu))
            self.done.wait(self.interval)

    def at(self, t: float) -> float:
        """The tree's CPU seconds at unix time t (linear between samples)."""
        points = self.samples
        for (t0, c0), (t1, c1) in itertools.pairwise(points):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c0
        return points[-1][1] if t > points[-1][0] else points[0][1]


def run_tool(name: str, shape: Shape, url: str, tokenizer: Path) -> dict[str, Any]:
    """One tool, one shape, against `url`: its rates, CPU and errors from its own records."""
    with tempfile.TemporaryDirectory(prefix=f"peers-{name}-") as tmp:
        work = Path(tmp)
        inv = TOOLS[name](url, shape, work, tokenizer)
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        with (work / "tool.log").open("wb") as log:
            proc = subprocess.Popen(inv.cmd, cwd=ROOT, env=os.environ | inv.env, stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
            sampler = CpuSampler(proc.pid)
            sampler.start()
            code = proc.wait(timeout=900)
            sampler.done.set()
            sampler.join()
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if code != 0:
            tail = (work / "tool.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited {code} on {shape.name}:\n{tail}")
        records = inv.parse()
    if not records:
        raise RuntimeError(f"{name} recorded no finished request on {shape.name}")
    start, end = min(r.start for r in records), max(r.end for r in records)
    span = end - start
    cpu = sampler.at(end) - sampler.at(start)
    whole = sum(getattr(usage1, f) - getattr(usage0, f) for f in ("ru_utime", "ru_stime"))
    # From the first request to the process's exit: also the work a tool defers past its
    # last response (parsing, records, reports), none of its start-up.
    after_start = whole - sampler.at(start)
    row: dict[str, Any] = {
        "requests": len(records),
        "failed": shape.requests - len(records),
        "requests_per_s": round(len(records) / span, 1),
        "chunks_per_s": round(sum(r.chunks for r in records) / span, 1),
        "cpu_us_per_request": round(cpu / len(records) * 1e6),
        "cpu_to_exit_us_per_request": round(after_start / len(records) * 1e6),
        "span_s": round(span, 3),
        # The concurrency the tool really held: request-seconds over the span. A tool that
        # keeps fewer in flight than asked offers the server a lighter load. Three significant
        # figures: a paced tool on a fast stub holds a few hundredths, which one decimal
        # rounded to a false zero.
        "mean_in_flight": float(f"{sum(r.end - r.start for r in records) / span:.3g}"),
        "process_wall_s": round(time.time() - t0, 2),
        "process_cpu_s": round(whole, 2),
        "command": portable(inv.cmd, work),
    }
    if shape.delays:
        dicts = [{"ttft_s": r.ttft_s, "itl_p99_s": r.itl_p99_s} for r in records if r.ttft_s]
        row.update(errors_ms(dicts))
    return row


def portable(cmd: list[str], work: Path) -> list[str]:
    """The command as a reader can reuse it: no path of this machine (interpreter, peers'
    venvs, the run's temporary folder)."""
    swaps = ((str(work), "$WORK"), (str(peers_root()), "$PEERS"), (sys.executable, "python"),
             (str(ROOT) + "/", ""), (tempfile.gettempdir() + "/", "$TMP/"))  # fmt: skip
    out = []
    for arg in cmd:
        for old, new in swaps:
            arg = arg.replace(old, new)
        out.append(arg)
    return out


def one_run(name: str, shape: Shape, number: int, tokenizer: Path) -> dict[str, Any]:
    """A tool's run against a fresh stub, with the stub's lateness and the load average."""
    row, load, stats = with_fresh_stub(
        lambda url: run_tool(name, shape, url, tokenizer), uvloop=False, delays=shape.delays
    )
    row.update(shape=shape.name, tool=name, round=number, load_1m=round(load, 2))
    if shape.delays and stats.get("lateness_p99_s") is not None:
        row["stub_late_p50_ms"] = round(stats["lateness_p50_s"] * 1000, 3)
        row["stub_late_p99_ms"] = round(stats["lateness_p99_s"] * 1000, 3)
    return row


def medians(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """Median over rounds of every number, per (shape, tool)."""
    keys = (*RATE_KEYS, *ERROR_KEYS, "stub_late_p99_ms", "mean_in_flight")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["shape"], row["tool"]), []).append(row)
    return {
        group: {k: statistics.median(r[k] for r in members) for k in keys if k in members[0]}
        for group, members in groups.items()
    }


# Tools that only run the timing shapes: a start or an offered load that matters to timing,
# not to a throughput client.
TIMING_ONLY = ("llmb-loadgen-ramp", "llmb-loadgen-paced", "aiperf-ramp")


def verdict(med: dict[tuple[str, str], dict[str, float]], shapes: list[Shape]) -> list[str]:
    """llmb-loadgen against the best peer per shape: rates >= 1.5x, errors and CPU <=. On the
    timing shapes also its ramped start against the best peer (AIPerf ramped too), and the
    paced variant against inference-perf, at the same offered load."""
    lines = []
    for shape in shapes:
        peers = [med[(shape.name, p)] for p in PEER_TOOLS if (shape.name, p) in med]
        for tool in ("llmb-loadgen", "llmb-loadgen-ramp"):
            ours = med.get((shape.name, tool))
            if ours and peers:
                lines.append(f"{shape.name} {tool}: " + "; ".join(_checks(shape, ours, peers)))
        paced = med.get((shape.name, "llmb-loadgen-paced"))
        same = med.get((shape.name, "inference-perf"))
        if shape.delays and paced and same:
            checks = _checks(shape, paced, [same])
            lines.append(f"{shape.name} paced vs inference-perf: " + "; ".join(checks))
    return lines


def _checks(shape: Shape, ours: dict[str, float], peers: list[dict[str, float]]) -> list[str]:
    """One tool's figures against the best of `peers`, each marked ok or NOT MET."""
    checks = []
    keys = ERROR_KEYS if shape.delays else ("requests_per_s", "chunks_per_s")
    for key in (*keys, "cpu_us_per_request", "cpu_to_exit_us_per_request"):
        if key.endswith("_per_s"):
            peer = max(p[key] for p in peers)
            ratio = ours[key] / peer
            ok = ratio >= 1.5
            checks.append(f"{key} {ours[key]:g} vs {peer:g} ({ratio:.2f}x)")
        else:
            # Errors compare by size: a TTFT 5 ms early is as wrong as 5 ms late.
            peer = min(abs(p[key]) for p in peers)
            ok = abs(ours[key]) <= peer
            checks.append(f"{key} {abs(ours[key]):g} vs {peer:g}")
        checks[-1] += " ok" if ok else " NOT MET"
    return checks


def table(med: dict[tuple[str, str], dict[str, float]], rows: list[dict[str, Any]]) -> str:
    """The markdown table: medians per shape and tool, every round's rate in brackets."""
    head = ("| shape | tool | req/s (rounds) | chunks/s | CPU µs/req in span / to exit "
            "| TTFT err p50 / p99 ms | ITL-p99 err p50 / p99 ms | stub late p99 ms "
            "| in flight |")  # fmt: skip
    out = [head, "|" + "---|" * 9]
    for (shape, tool), m in med.items():
        runs = ", ".join(f"{r['requests_per_s']:g}" for r in rows
                         if r["shape"] == shape and r["tool"] == tool)  # fmt: skip
        errs = ("—", "—", "—")
        if "ttft_err_p50_ms" in m:
            errs = (f"{m['ttft_err_p50_ms']:.2f} / {m['ttft_err_p99_ms']:.2f}",
                    f"{m['itl_p99_err_p50_ms']:.2f} / {m['itl_p99_err_p99_ms']:.2f}",
                    f"{m.get('stub_late_p99_ms', 0):.2f}")  # fmt: skip
        out.append(
            f"| {shape} | {tool} | {m['requests_per_s']:g} ({runs}) | "
            f"{m['chunks_per_s']:g} | {m['cpu_us_per_request']:g} / "
            f"{m['cpu_to_exit_us_per_request']:g} | {' | '.join(errs)} | "
            f"{m.get('mean_in_flight', 0):g} |"
        )
    return "\n".join(out)


def build_shapes(args: argparse.Namespace) -> list[Shape]:
    """The shapes asked for, in order."""
    c = args.throughput_concurrency
    shapes = [
        Shape("short", c, args.short_requests, 1, 16, None),
        Shape("long", c, args.long_requests, args.long_tokens, 16, None),
    ]
    for conc in (int(x) for x in args.timing_concurrency.split(",") if x):
        shapes.append(Shape(f"timing-{conc}", conc, 3 * conc, 20, 512, (TTFT, ITL)))
    wanted = set(args.shapes.split(",")) if args.shapes else None
    return [
        s for s in shapes if wanted is None or s.name in wanted or s.name.split("-")[0] in wanted
    ]


def main(argv: list[str] | None = None) -> int:
    """Run every tool on every shape for the rounds; print rows, the table and the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--tools", default=",".join(TOOLS), help="comma list of " + ", ".join(TOOLS)
    )
    parser.add_argument(
        "--shapes", help="comma list: short, long, timing (all timing-C) or timing-C"
    )
    parser.add_argument("--throughput-concurrency", type=int, default=64)
    parser.add_argument("--short-requests", type=int, default=4000)
    parser.add_argument("--long-requests", type=int, default=400)
    parser.add_argument("--long-tokens", type=int, default=256)
    parser.add_argument("--timing-concurrency", default="64,256", help="comma list")
    parser.add_argument("--json", type=Path, help="write every row, the medians and versions")
    args = parser.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        parser.error(f"unknown tool(s): {', '.join(unknown)}")
    # The tokenizer the peers need is made with the AIPerf venv's transformers.
    venvs = {VENV_OF[t] for t in tools if t in VENV_OF}
    needed = {"aiperf"} | venvs if venvs else set()
    missing = [r for t in sorted(needed) if (r := missing_reason(PEERS[t]))]
    if missing:
        print("loadgen_peers: " + "; ".join(missing), file=sys.stderr)
        return 2
    shapes = build_shapes(args)
    info = {"versions": versions(), "cpus": len(os.sched_getaffinity(0)),
            "python": sys.version.split()[0], "load_avg_start": os.getloadavg(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "shapes": [asdict(s) for s in shapes]}  # fmt: skip
    print(json.dumps(info), flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peers-tok-") as tmp:
        tokenizer = make_tokenizer(Path(tmp)) if needed else Path(tmp)
        for number in range(args.rounds):
            shift = number % len(tools)
            for shape in shapes:
                for name in tools[shift:] + tools[:shift]:
                    if name in TIMING_ONLY and not shape.delays:
                        continue
                    rows.append(one_run(name, shape, number, tokenizer))
                    printable = {k: v for k, v in rows[-1].items() if k != "command"}
                    print(json.dumps(printable), flush=True)
    med = medians(rows)
    print(table(med, rows))
    for line in verdict(med, shapes):
        print(line)
    info["load_avg_end"] = os.getloadavg()
    if args.json:
        summary = {
            **info,
            "rows": rows,
            "medians": [{"shape": s, "tool": t, **m} for (s, t), m in med.items()],
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
