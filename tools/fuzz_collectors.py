"""Fuzz the engine collectors with mutated real engine answers, over real HTTP.

Every case takes the captured answers of a real llama-server (CPU, Gemma 3 270M) or a real
SGLang 0.5.23 (tests/fixtures/), mutates one of them (structure-aware for JSON and the
Prometheus text format, or raw bytes), serves them from a fake engine on 127.0.0.1 and
scrapes the real exporter application (`exporter.server.make_app`) on 127.0.0.1. Counted:

* exceptions that escaped a collector (the runner logs "source X crashed");
* HTTP answers of the exporter other than 200;
* outputs that `promtool check metrics` rejects (every distinct output is checked);
* resident memory of this process, every 500 cases.

    python -m tools.fuzz_collectors --cases 10000 --seed 1

The mutators are also used by the hypothesis tests (tests/unit/test_fuzz_collectors.py).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import logging
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
LLAMA = FIXTURES / "llamacpp-cpu-gemma3-270m"
SGLANG = FIXTURES / "sglang-0.5.23"
SGLANG_ENDPOINTS = FIXTURES / "sglang-0.5.23-endpoints"

# Real answers, by engine kind and path.
BODIES: dict[str, dict[str, Path]] = {
    "llamacpp": {
        "/metrics": LLAMA / "llamacpp_metrics_busy.txt",
        "/slots": LLAMA / "slots_busy.json",
        "/props": LLAMA / "props.json",
        "/v1/models": LLAMA / "v1_models.json",
    },
    "sglang": {
        "/metrics": SGLANG / "metrics-busy.txt",
        "/server_info": SGLANG_ENDPOINTS / "server_info.json",
        "/model_info": SGLANG_ENDPOINTS / "model_info.json",
        "/v1/models": SGLANG_ENDPOINTS / "v1_models.json",
    },
}
LLAMA_LOG = LLAMA / "server.log"

# Raw JSON texts substituted for placeholder strings after serialization.
_RAW_JSON = {
    "__1e400__": "1e400",
    "__-1e400__": "-1e400",
    "__nan__": "NaN",
    "__bigint__": "9" * 5000,
    "__deep_list__": "[" * 3000 + "]" * 3000,
    "__deep_obj__": '{"a":' * 3000 + "1" + "}" * 3000,
}
HOSTILE_JSON: list[Any] = [
    # Lone surrogates several times over: they used to fail the whole answer (HTTP 500).
    *(["\ud800", "a\udfffb", "\udc80x"] * 3),
    "x\x00y\n\x1b[31m",
    "big",
    "lots",
    "",
    "1,5",
    "é" * 300,
    "x" * 20_000,
    -1,
    0,
    -1e308,
    2**64,
    10**30,
    3.5,
    True,
    False,
    None,
    ["a"],
    [1, 2],
    [],
    {},
    {"x": {"y": [1]}},
    *_RAW_JSON,
]
HOSTILE_VALUES = [
    "NaN",
    "+Inf",
    "-Inf",
    "1e400",
    "-1",
    "abc",
    "1_0",
    "0x10",
    "",
    "1.5.5",
    "9" * 400,
    "infinity",
]
HOSTILE_LABELS = ["1,5", "", "+Inf", "abc", 'a"b', "a\\b", "\\n", "\x00", "é\u2028", "NaN"]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indexes) into a JSON document, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out.extend(_paths(value, (*prefix, index)))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


# Keys the collectors read: half of the JSON mutations aim at one of them.
READ_KEYS = frozenset(
    {
        "build_info", "model_path", "model_alias", "model_ftype", "total_slots", "n_ctx",
        "default_generation_settings", "data", "id", "meta", "size", "n_params", "ftype",
        "is_processing", "n_prompt_tokens", "served_model_name", "max_running_requests",
        "internal_states", "effective_max_running_requests_per_dp", "cpu_offload_gb",
        "kv_cache_dtype", "quantization", "dtype", "version", "simulated", "tp_size",
        "max_total_num_tokens", "page_size", "max_model_len",
    }
)  # fmt: skip


# Keys whose strings end up as label values (model, version, quantization).
LABEL_KEYS = frozenset(
    {"id", "build_info", "model_path", "model_alias", "model_ftype", "ftype",
     "served_model_name", "version", "quantization", "dtype", "kv_cache_dtype"}
)  # fmt: skip


def mutate_json(text: str, rng: random.Random) -> str:
    """One structural change to a JSON document: a hostile value, a deletion or a new type."""
    doc = json.loads(text)
    paths = _paths(doc)
    read = [p for p in paths if p and p[-1] in READ_KEYS]
    path = rng.choice(read if read and rng.random() < 0.5 else paths)
    action = rng.random()
    if path and path[-1] in LABEL_KEYS and action < 0.35:
        # A string that becomes a label: the characters that used to fail the whole answer.
        doc = _set(doc, path, rng.choice(["\ud800", "m\udfff", "a\x00b", "x\ny", "\x1b[1m"]))
    elif action < 0.7:
        doc = _set(doc, path, rng.choice(HOSTILE_JSON))
    elif action < 0.85 and path:
        doc = _set(doc, path, None, delete=True)
    else:
        doc = _set(doc, path, rng.choice([[1, 2], "text", 7, {"data": "x"}]))
    out = json.dumps(doc)
    for placeholder, raw in _RAW_JSON.items():
        out = out.replace(json.dumps(placeholder), raw)
    return out


_MAPPED = re.compile(
    r"^(?:llamacpp:|sglang:(?:num_running_reqs|num_queue_reqs|token_usage|max_total_num_tokens|"
    r"context_len|kv_used_tokens|num_used_tokens|time_to_first_token|inter_token_latency|"
    r"queue_time|e2e_request|prompt_tokens_total|generation_tokens_total|cached_tokens|"
    r"weight_memory|kv_cache_memory|startup_time|num_requests_total|num_retracted))"
)


def _sample_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if line and not line.startswith("#")]


def mutate_exposition(text: str, rng: random.Random) -> str:
    """One change to a text exposition: a value, a label, a line (lost, doubled, cut...)."""
    lines = text.split("\n")
    samples = _sample_lines(lines)
    if not samples:
        return text + "\n" + rng.choice(["garbage", "x 1", "{}"])
    # Half the time a line of a family the collectors map (SGLang exposes ~100 they skip).
    mapped = [i for i in samples if _MAPPED.search(lines[i])]
    i = rng.choice(mapped if mapped and rng.random() < 0.5 else samples)
    line = lines[i]
    action = rng.randrange(9)
    if action == 0:  # hostile value
        head = line.rsplit(" ", 1)[0]
        lines[i] = f"{head} {rng.choice(HOSTILE_VALUES)}"
    elif action == 1 and "=" in line:  # hostile label value (incl. le)
        start = line.index('="') + 2
        end = line.index('"', start)
        value = rng.choice(HOSTILE_LABELS).replace("\\", "\\\\").replace('"', '\\"')
        lines[i] = line[:start] + value + line[end:]
    elif action == 2:
        del lines[i]
    elif action == 3:
        lines.insert(i, line)
    elif action == 4 and i + 1 < len(lines):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif action == 5:
        lines[i] = line[: rng.randrange(len(line) + 1)]
    elif action == 6:
        pos = rng.randrange(len(line) + 1)
        lines[i] = line[:pos] + rng.choice(['"', "{", "}", ",", " ", "=", "\\", "#"]) + line[pos:]
    elif action == 7:
        lines.insert(i, rng.choice(["garbage", "{}", "x{ 1", '{"a"} 1', "a b c d e"]))
    else:  # a whole family as non-finite values
        name = line.split("{", 1)[0].split(" ", 1)[0]
        value = rng.choice(["NaN", "+Inf"])
        lines = [
            (ln.rsplit(" ", 1)[0] + " " + value) if ln.startswith(name) else ln for ln in lines
        ]
    return "\n".join(lines)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: cut, NUL/invalid UTF-8/surrogate bytes inserted, bytes flipped."""
    action = rng.randrange(4)
    pos = rng.randrange(len(data) + 1)
    if action == 0:
        return data[:pos]
    if action == 1:
        junk = rng.choice([b"\x00", b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"\r", b"\x1b[0m"])
        return data[:pos] + junk + data[pos:]
    if action == 2 and data:
        flipped = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    return data + data[: rng.randrange(len(data) + 1)]


def mutate_body(path: str, data: bytes, rng: random.Random) -> bytes:
    """A mutation of one engine answer, structure-aware two times in three."""
    for _ in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < 0.33:
            data = mutate_bytes(data, rng)
            continue
        try:
            text = data.decode("utf-8")
            if path == "/metrics":
                data = mutate_exposition(text, rng).encode("utf-8", "surrogatepass")
            else:
                data = mutate_json(text, rng).encode("utf-8", "surrogatepass")
        except (ValueError, IndexError, RecursionError):
            data = mutate_bytes(data, rng)  # already broken: keep breaking bytes
    return data


def mutate_log(text: str, rng: random.Random) -> str:
    """A llama-server log with some lines damaged (numbers, JSON lines, binary)."""
    lines = text.split("\n")
    for _ in range(rng.randrange(1, 6)):
        i = rng.randrange(len(lines))
        choice = rng.randrange(4)
        if choice == 0:
            lines[i] = lines[i].replace("0", rng.choice(["9" * 50, ".", "1e400", "-"]))
        elif choice == 1:
            lines[i] = json.dumps({"msg": rng.choice([lines[i], ["x"], 5, None])})
        elif choice == 2:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)] + "\x00\udcff"
        else:
            lines.insert(i, "{" * rng.randrange(1, 3000))
    return "\n".join(lines)


# --- the run over real HTTP -----------------------------------------------------------------


@dataclass
class PromtoolTally:
    """`promtool check metrics` over every distinct exporter answer."""

    checked: int = 0
    rejected: int = 0
    examples: list[str] = field(default_factory=list)  # the first three rejections

    def record(self, ok: bool, problems: str) -> None:
        """Count one checked answer; keep the start of the first rejections."""
        self.checked += 1
        if not ok:
            self.rejected += 1
            if len(self.examples) < 3:
                self.examples.append(problems[:500])


@dataclass
class Counts:
    """What the fuzz run found."""

    cases: int = 0
    escaped: int = 0
    http_errors: int = 0
    promtool: PromtoolTally = field(default_factory=PromtoolTally)
    by_reason: Counter[str] = field(default_factory=Counter)
    rss_mib: list[float] = field(default_factory=list)


class _CrashCounter(logging.Handler):
    """Counts the runner's 'source X crashed' log records: exceptions out of a collector."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "crashed" in record.getMessage():
            self.count += 1


# Series whose values change every scrape (durations, cumulative error counts): masked when
# deciding whether promtool has seen an output already.
_VOLATILE = re.compile(r"^((?:llmb_source_|llmb_engine_restarts)[^ ]*) .*$", re.MULTILINE)


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def _promtool_ok(promtool: str, text: str) -> tuple[bool, str]:
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    # Lint findings (names, units) go to stdout with exit 0 or 3; only format errors fail.
    problems = proc.stderr.decode(errors="replace") + proc.stdout.decode(errors="replace")
    return proc.returncode in (0, 3) and "error" not in proc.stderr.decode().lower(), problems


async def run(
    cases: int, seed: int, promtool: str | None, progress: Callable[[str], None]
) -> Counts:
    """Fuzz `cases` mutated answers through the real exporter over HTTP."""
    import httpx
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from config.settings import parse_config
    from exporter.app import build_runner
    from exporter.server import make_app

    rng = random.Random(seed)
    real = {kind: {p: f.read_bytes() for p, f in paths.items()} for kind, paths in BODIES.items()}
    served: dict[str, dict[str, bytes]] = {kind: dict(b) for kind, b in real.items()}

    def engine_app(kind: str) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            if request.path == "/health":
                return web.Response(text='{"status":"ok"}')
            path = "/model_info" if request.path == "/get_model_info" else request.path
            body = served[kind].get(path)
            if body is None:
                return web.Response(status=404)
            return web.Response(body=body)

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handle)
        return app

    engines = {kind: TestServer(engine_app(kind), host="127.0.0.1") for kind in BODIES}
    for server in engines.values():
        await server.start_server()
    workdir = Path(tempfile.mkdtemp(prefix="llmb-fuzz-"))
    log_file = workdir / "llama.log"
    log_text = LLAMA_LOG.read_text()
    log_file.write_text(log_text)
    config = parse_config(
        {
            "engines": [
                {
                    "name": "llama",
                    "kind": "llamacpp",
                    "url": f"http://127.0.0.1:{engines['llamacpp'].port}",
                    "log_file": str(log_file),
                },
                {
                    "name": "sgl",
                    "kind": "sglang",
                    "url": f"http://127.0.0.1:{engines['sglang'].port}",
                },
            ],
            "gpu": {"enabled": False},
        }
    )
    crashes = _CrashCounter()
    logging.getLogger("exporter").addHandler(crashes)
    logging.getLogger("exporter").setLevel(logging.INFO)
    logging.getLogger("exporter").propagate = False
    runner = build_runner(config)
    # Collectors re-read their static endpoints (/v1/models, /server_info...) only every 60 s;
    # a clock that jumps a minute per reading makes every case reach them.
    jumps = itertools.count(0.0, 61.0)
    for collector in runner.collectors:
        for attr in ("clock", "_clock"):
            if hasattr(collector, attr):
                setattr(collector, attr, lambda: next(jumps))
    exporter = TestServer(make_app(runner), host="127.0.0.1")
    await exporter.start_server()
    counts = Counts()
    seen: set[bytes] = set()
    log_dirty = False
    started = time.monotonic()
    try:
        async with httpx.AsyncClient() as client:
            for case in range(cases):
                for kind in BODIES:
                    served[kind] = dict(real[kind])
                kind = rng.choice(list(BODIES))
                path = rng.choice(list(BODIES[kind]))
                served[kind][path] = mutate_body(path, real[kind][path], rng)
                if kind == "llamacpp" and rng.random() < 0.1:
                    log_file.write_text(mutate_log(log_text, rng), errors="surrogateescape")
                    log_dirty = True
                elif log_dirty:
                    log_file.write_text(log_text)
                    log_dirty = False
                resp = await client.get(
                    f"http://127.0.0.1:{exporter.port}/metrics",
                    headers={"X-Prometheus-Scrape-Timeout-Seconds": "4"},
                    timeout=30,
                )
                counts.cases += 1
                if resp.status_code != 200:
                    counts.http_errors += 1
                    continue
                # Outputs differ in values mostly; promtool sees every distinct output.
                digest = hashlib.sha256(_VOLATILE.sub(r"\1 0", resp.text).encode()).digest()
                if promtool and digest not in seen:
                    seen.add(digest)
                    counts.promtool.record(*_promtool_ok(promtool, resp.text))
                if case % 500 == 0 or case == cases - 1:
                    counts.rss_mib.append(round(_rss_mib(), 1))
                    progress(
                        f"{case + 1}/{cases} cases, {time.monotonic() - started:.0f} s, "
                        f"RSS {counts.rss_mib[-1]} MiB, escaped {crashes.count}, "
                        f"HTTP errors {counts.http_errors}, promtool rejected "
                        f"{counts.promtool.rejected}/{counts.promtool.checked}"
                    )
        counts.escaped = crashes.count
        for (_source, reason), n in runner._errors.items():
            counts.by_reason[reason] += n
    finally:
        await exporter.close()
        for server in engines.values():
            await server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--cases", type=int, default=10_000, help="mutated answers to serve")
    parser.add_argument("--seed", type=int, default=1, help="random seed (same seed, same cases)")
    parser.add_argument(
        "--promtool", default=shutil.which("promtool") or "", help="promtool binary ('' = skip)"
    )
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error("--cases must be at least 1")
    counts = asyncio.run(
        run(args.cases, args.seed, args.promtool or None, lambda m: print(m, file=sys.stderr))
    )
    report = {
        "cases": counts.cases,
        "exceptions_escaping_a_collector": counts.escaped,
        "http_non_200": counts.http_errors,
        "promtool_checked_distinct_outputs": counts.promtool.checked,
        "promtool_rejected": counts.promtool.rejected,
        "source_errors_by_reason": dict(sorted(counts.by_reason.items())),
        "rss_mib_first_last_max": [counts.rss_mib[0], counts.rss_mib[-1], max(counts.rss_mib)],
        "rejected_examples": counts.promtool.examples,
    }
    print(json.dumps(report, indent=2))
    failed = counts.escaped or counts.http_errors or counts.promtool.rejected
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
