"""How bench/loadgen_peers.py drives each load generator, and reads back its own records.

Every tool runs as its own process (its real command line) against the same stub, with the
same shape: `/v1/completions` streaming (the one endpoint every tool's synthetic fixed-length
mode supports: inference-perf's `random` data is completions-only), `ignore_eos`, a fixed
prompt length and output length, a closed loop of C requests in flight, no warm-up. Each
adapter returns the command and a parser of the tool's *own* per-request records into `Req`:
what a user of that tool reads.

* llmb-loadgen: `python -m cli.loadgen run ...`, `requests.jsonl` (`ttft_s`, `itl_p99_s`,
  `chunks`, `start_time`/`end_time`);
* AIPerf: `aiperf profile ...`, `profile_export.jsonl` (`time_to_first_token`,
  `inter_chunk_latency`, `request_start_ns`/`request_end_ns`);
* inference-perf: `inference-perf --config_file ...`, `per_request_lifecycle_metrics.json`
  (`computed_metrics.time_to_first_token`, `inter_token_latencies`, `start_time`/`end_time`);
* bare: bench/loadgen_accuracy.py's bare aiohttp client.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.loadgen_throughput import free_port  # noqa: E402
from bench.peer_venvs import PEERS  # noqa: E402
from loadgen.results import percentile  # noqa: E402

# perf_counter (CLOCK_MONOTONIC) is one clock for every process on Linux: add this to get
# unix time (the tools stamp with one or the other).
MONO_TO_UNIX = time.time() - time.perf_counter()
MODEL = "stub-model"
TOKENIZER_REPO = "llmb/word-level"  # the local tokenizer's id in the private HF cache
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


@dataclass(frozen=True)
class Shape:
    """One load shape: closed loop of `concurrency`, `requests` of `max_tokens` tokens."""

    name: str
    concurrency: int
    requests: int
    max_tokens: int
    prompt_tokens: int
    delays: tuple[float, float] | None  # the stub's (TTFT, ITL); None = zero-delay stub


@dataclass(frozen=True)
class Req:
    """One finished request as the tool recorded it (times in unix seconds)."""

    start: float
    end: float
    ttft_s: float | None
    itl_p99_s: float | None
    chunks: int


@dataclass(frozen=True)
class Invocation:
    """A tool's command line, environment additions and the parser of its records."""

    cmd: list[str]
    env: dict[str, str]
    parse: Callable[[], list[Req]]


def make_tokenizer(work: Path) -> Path:
    """A word-level tokenizer (w0..w4095, as the stub counts words) made locally with the
    peers' own `transformers`, laid out as a Hugging Face cache entry under `work/hf`
    (AIPerf 0.13.0 offline resolves a tokenizer only from the cache) and as a plain folder
    (`work/tokenizer`, for inference-perf). Nothing is downloaded."""
    plain = work / "tokenizer"
    shim = ROOT / "bench" / "loadgen_sglang_shim.py"
    python = str(PEERS["aiperf"].python)
    subprocess.run([python, str(shim), "--make-tokenizer", str(plain)], check=True,
                   env=os.environ | OFFLINE, stderr=subprocess.DEVNULL)  # fmt: skip
    entry = work / "hf" / "hub" / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    revision = "0" * 40
    shutil.copytree(plain, entry / "snapshots" / revision)
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(revision)
    return plain


def llmb_loadgen(url: str, shape: Shape, work: Path, tokenizer: Path) -> Invocation:
    """`llmb-loadgen run` of this checkout; prompt calibrated on the stub."""
    out = work / "out"
    cmd = [sys.executable, "-m", "cli.loadgen", "run", "--url", url, "--endpoint", "completions",
           "--concurrency", str(shape.concurrency), "--requests", str(shape.requests),
           "--warmup", "0", "--max-tokens", str(shape.max_tokens),
           "--prompt-tokens", str(shape.prompt_tokens), "--out", str(out),
           "--metrics-port", str(free_port()), "--no-progress"]  # fmt: skip

    def parse() -> list[Req]:
        rows = map(json.loads, (out / "requests.jsonl").read_text().splitlines())
        return [Req(r["start_time"], r["end_time"], r["ttft_s"], r["itl_p99_s"], r["chunks"])
                for r in rows if r["error"] is None]  # fmt: skip

    return Invocation(cmd, {"PYTHONPATH": str(ROOT)}, parse)


def llmb_loadgen_paced(url: str, shape: Shape, work: Path, tokenizer: Path) -> Invocation:
    """llmb-loadgen offering the load inference-perf offers in its `concurrent` mode: every
    request due within one second at exponential (Poisson) gaps, at most C in flight. Its
    `main.py` sets a concurrent stage's rate to the request count over a duration of 1 s, and
    each worker takes the next due request when a semaphore slot frees. The waves of a closed
    loop never form, so the stub is read one request at a time: the same timing question at
    the same offered load as that peer."""
    inv = llmb_loadgen(url, shape, work, tokenizer)
    return replace(inv, cmd=[*inv.cmd, "--rate", str(shape.requests), "--arrival", "poisson"])


# The ramp of the `-ramp` variants: every tool that has one starts its C requests over this
# many seconds (llmb-loadgen `--ramp-up`, AIPerf `--concurrency-ramp-duration`). A tenth of a
# second spreads a wave of 256 over 0.4 ms each, more than the stub needs to read one request,
# and costs the 3-wave timing runs about 3 % of their request-seconds.
RAMP_S = 0.1


def llmb_loadgen_ramp(url: str, shape: Shape, work: Path, tokenizer: Path) -> Invocation:
    """llmb-loadgen's closed loop started over RAMP_S (`--ramp-up`): equal requests keep the
    spread, so the stub never reads a whole wave of C requests in one instant."""
    inv = llmb_loadgen(url, shape, work, tokenizer)
    return replace(inv, cmd=[*inv.cmd, "--ramp-up", str(RAMP_S)])


def aiperf(url: str, shape: Shape, work: Path, tokenizer: Path) -> Invocation:
    """`aiperf profile`, synthetic fixed-length prompts, no UI, no server/GPU metrics polling
    (the stub has none; a poller would cost the stub CPU that no other tool takes)."""
    peer = PEERS["aiperf"]
    cmd = [str(peer.executable), "profile", "--model", MODEL, "--tokenizer", TOKENIZER_REPO,
           "--url", url, "--endpoint-type", "completions", "--streaming",
           "--concurrency", str(shape.concurrency), "--request-count", str(shape.requests),
           "--prompt-input-tokens-mean", str(shape.prompt_tokens - 1),
           "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(shape.max_tokens),
           "--prompt-output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--random-seed", "1", "--artifact-dir", str(work / "artifacts"), "--ui-type", "none",
           "--no-server-metrics", "--no-gpu-telemetry"]  # fmt: skip

    def parse() -> list[Req]:
        out = []
        for line in (work / "artifacts" / "profile_export.jsonl").read_text().splitlines():
            rec = json.loads(line)
            meta, metrics = rec["metadata"], rec.get("metrics") or {}
            if rec.get("error") or "time_to_first_token" not in metrics:
                continue
            gaps = [ms / 1000 for ms in metrics.get("inter_chunk_latency", {}).get("value", [])]
            out.append(Req(meta["request_start_ns"] / 1e9, meta["request_end_ns"] / 1e9,
                           metrics["time_to_first_token"]["value"] / 1000,
                           percentile(gaps, 99), len(gaps) + 1))  # fmt: skip
        return out

    # TMPDIR: AIPerf puts its dataset (`aiperf_mmap_<id>`) and its ZMQ sockets (`tmp*/aiperf`)
    # in the temporary folder and leaves both behind; in the run's own folder they go with it.
    env = OFFLINE | {"HF_HOME": str(tokenizer.parent / "hf"), "TMPDIR": str(work)}
    return Invocation(cmd, env, parse)


def aiperf_ramp(url: str, shape: Shape, work: Path, tokenizer: Path) -> Invocation:
    """AIPerf with its own ramp over RAMP_S (`--concurrency-ramp-duration`: concurrency from
    1 to C), the same start llmb-loadgen-ramp gets."""
    inv = aiperf(url, shape, work, tokenizer)
    return replace(inv, cmd=[*inv.cmd, "--concurrency-ramp-duration", str(RAMP_S)])


def inference_perf(url: str, shape: Shape, work: Path, tokenizer: Path) -> Invocation:
    """`inference-perf` with a `concurrent` load stage and `random` fixed-length data; every
    worker may hold the whole concurrency (its default cap, 100 per worker, is below 256 on
    2 cores)."""
    peer = PEERS["inference-perf"]
    n, c = shape.requests, shape.concurrency
    lengths = {
        "input_distribution": shape.prompt_tokens - 1,
        "output_distribution": shape.max_tokens,
    }
    data: dict[str, Any] = {"type": "random"}
    for key, value in lengths.items():
        data[key] = {"min": value, "max": value, "mean": value, "std_dev": 0, "total_count": n}
    config = {
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": MODEL, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "data": data,
        "load": {"type": "concurrent", "stages": [{"num_requests": n, "concurrency_level": c}],
                 "worker_max_concurrency": c, "base_seed": 1},
        "report": {"request_lifecycle": {
            "summary": True, "per_stage": False, "per_request": True,
            "per_request_fields": {"request": False, "response": False, "info": True,
                                   "response_chunks": False, "computed_metrics": True}}},
        "storage": {"local_storage": {"path": str(work / "report")}},
    }  # fmt: skip
    path = work / "config.yml"
    path.write_text(json.dumps(config))  # JSON is YAML

    def parse() -> list[Req]:
        rows = json.loads((work / "report" / "per_request_lifecycle_metrics.json").read_text())
        out = []
        for row in rows:
            computed = row.get("computed_metrics")
            if row.get("error") or not computed:
                continue
            times = row["info"]["response_metrics"]["chunk_times"]
            out.append(Req(row["start_time"] + MONO_TO_UNIX, row["end_time"] + MONO_TO_UNIX,
                           computed["time_to_first_token"],
                           percentile(computed["inter_token_latencies"] or [], 99),
                           len(times)))  # fmt: skip
        return out

    return Invocation([str(peer.executable), "--config_file", str(path)], dict(OFFLINE), parse)


def bare(url: str, shape: Shape, work: Path, tokenizer: Path) -> Invocation:
    """bench/loadgen_accuracy.py's bare aiohttp client (the yardstick, not a peer)."""
    out = work / "bare.json"
    cmd = [sys.executable, str(ROOT / "bench" / "loadgen_accuracy.py"), "--bare", url,
           "--concurrency", str(shape.concurrency), "--requests", str(shape.requests),
           "--json", str(out), "--bare-shape", str(shape.max_tokens),
           str(shape.prompt_tokens - 1), "completions"]  # fmt: skip

    def parse() -> list[Req]:
        rows = json.loads(out.read_text())
        return [Req(r["start_s"] + MONO_TO_UNIX, r["end_s"] + MONO_TO_UNIX, r["ttft_s"],
                    r["itl_p99_s"], r["chunks"]) for r in rows]  # fmt: skip

    return Invocation(cmd, {}, parse)


Adapter = Callable[[str, Shape, Path, Path], Invocation]
TOOLS: dict[str, Adapter] = {
    "llmb-loadgen": llmb_loadgen,
    "llmb-loadgen-ramp": llmb_loadgen_ramp,
    "llmb-loadgen-paced": llmb_loadgen_paced,
    "aiperf": aiperf,
    "aiperf-ramp": aiperf_ramp,
    "inference-perf": inference_perf,
    "bare": bare,
}
PEER_TOOLS = ("aiperf", "aiperf-ramp", "inference-perf")
# The peer whose venv a tool runs from (bench/peer_venvs.py's PEERS).
VENV_OF = {"aiperf": "aiperf", "aiperf-ramp": "aiperf", "inference-perf": "inference-perf"}


def versions() -> dict[str, str]:
    """Each tool's exact version (the peers' from their own venvs)."""
    import aiohttp

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    found = {"llmb-loadgen": f"git {head or 'unknown'}", "bare": f"aiohttp {aiohttp.__version__}"}
    for name, peer in PEERS.items():
        code = f"import importlib.metadata as m; print(m.version({name!r}))"
        got = subprocess.run([str(peer.python), "-c", code], capture_output=True, text=True,
                             check=False)  # fmt: skip
        found[name] = got.stdout.strip() or "not installed"
    return found
