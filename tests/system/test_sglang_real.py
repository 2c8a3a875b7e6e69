"""The product against a real SGLang 0.5.11 server on the CPU (tests/plugins/sglang.py).

What is real: SGLang's HTTP server, tokenizer manager, scheduler (radix cache, admission by its
token pool, retraction) and metrics collector, serving the tiny Qwen2 folder with random
weights; every request and number here. What is not: this machine has no GPU, so the residency
tests give the exporter an NVML-shaped GPU file sized from the server's own numbers.

Servers: `sglang_server` (running cap 8, 16384-token pool) and `sglang_pool_server` (1024-token
pool, cap 16), each started once per session. Requests send `ignore_eos` (random weights).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cli.loadgen import main as loadgen_main
from core.conditions import POOL_ACTION, evaluate
from core.signals import Signals
from exporter.collectors.sglang.memory import checkpoint_weight_bytes
from model.geometry import geometry_from_hf_config
from tests.integration.test_sim_sglang_fidelity import (
    KNOWN_SIM_DIFFERENCES,
    shape_differences,
    shapes,
    simulated_shapes,
)
from tests.paths import FIXTURES
from tests.plugins.exporter import ExporterProcess, parse_samples, pick
from tests.plugins.sglang import (
    KV_BYTES_PER_TOKEN,
    MODEL_DIR,
    POOL_SERVER,
    SERVED_MODEL_NAME,
    SGLANG_SERVER,
    SGLANG_VERSION,
    SglangServer,
    burst,
    complete,
    prompt_ids,
)

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

FIXTURES = FIXTURES
H200 = FIXTURES / "sglang-0.5.11-h200"
GIB = 1 << 30


# -- /metrics -------------------------------------------------------------------------------------
def scrape(url: str) -> str:
    resp = httpx.get(url + "/metrics", timeout=30)
    resp.raise_for_status()
    return resp.text


def gauge(text: str, name: str) -> float:
    """The value of one unlabelled-by-us SGLang series (rank 0 of the one scheduler)."""
    values = pick(parse_samples(text), name)
    assert len(values) == 1, (name, values)
    return values[0]


@dataclass
class Watch:
    """The largest value each series reached while the watcher ran."""

    peaks: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def see(self, name: str, value: float) -> None:
        self.peaks[name] = max(value, self.peaks.get(name, value))


@contextmanager
def watching(read: Callable[[], dict[str, float]], every: float = 0.1) -> Iterator[Watch]:
    """Poll `read` in a thread while the block runs."""
    watch = Watch()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for name, value in read().items():
                watch.see(name, value)
            watch.samples += 1
            stop.wait(every)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join(timeout=30)


def engine_gauges(url: str) -> Callable[[], dict[str, float]]:
    names = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")

    def read() -> dict[str, float]:
        text = scrape(url)
        return {n: gauge(text, n) for n in names}

    return read


def exporter_config(server: SglangServer, **extra: Any) -> dict[str, Any]:
    engine = {"name": "sgl", "kind": "sglang", "url": server.url, "log_file": str(server.log)}
    return {"engines": [engine], "gpu": {"enabled": False}, **extra}


# -- the server's own answers ---------------------------------------------------------------------
def test_server_answers_what_it_was_started_with(sglang_server: SglangServer) -> None:
    """/server_info, /get_model_info and /v1/models of the real 0.5.11 server."""
    info = httpx.get(sglang_server.url + "/server_info", timeout=30).json()
    assert info["version"] == SGLANG_VERSION and info["status"] == "ready"
    assert info["max_total_num_tokens"] == SGLANG_SERVER.max_total_tokens
    assert info["max_running_requests"] == SGLANG_SERVER.max_running_requests
    assert info["context_length"] == SGLANG_SERVER.context_length
    assert (info["device"], info["load_format"]) == ("cpu", "dummy")
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == SGLANG_SERVER.max_running_requests
    memory = state["memory_usage"]
    assert set(memory) == {"weight", "kvcache", "token_capacity", "graph"}
    assert memory["token_capacity"] == SGLANG_SERVER.max_total_tokens
    # K + V of the pool in GiB, rounded to 2 places as SGLang writes it.
    pool = SGLANG_SERVER.max_total_tokens * KV_BYTES_PER_TOKEN / GIB
    assert memory["kvcache"] == round(pool, 2)
    model = httpx.get(sglang_server.url + "/get_model_info", timeout=30).json()
    assert model["architectures"] == ["Qwen2ForCausalLM"] and model["model_type"] == "qwen2"
    # The same keys as on the H200 (0.5.11 answers these endpoints the same on both).
    assert set(model) == set(json.loads((H200 / "get_model_info.json").read_text()))
    assert set(info) == set(json.loads((H200 / "server_info.json").read_text()))
    models = httpx.get(sglang_server.url + "/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [
        (SERVED_MODEL_NAME, SGLANG_SERVER.context_length)
    ]


def test_bounded_load_fills_the_running_cap_and_queues_the_rest(
    sglang_server: SglangServer,
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
) -> None:
    """12 requests against a cap of 8: 8 run, the rest wait; SGLang's gauges and counters and
    the exporter's series say so, and every answer has the asked-for token counts."""
    exporter = exporter_process(exporter_config(sglang_server))
    before = parse_samples(scrape(sglang_server.url))
    prompts = [prompt_ids(24 + i, seed=100 + i) for i in range(12)]

    def read_exporter() -> dict[str, float]:
        samples = exporter.scrape()
        return {
            name: value
            for name in ("llmb_engine_requests_running", "llmb_engine_requests_waiting")
            for value in pick(samples, name, engine="sgl")
        }

    # SGLang sets its gauges only at a prefill and every 40th decode step, so a queue of 4 may
    # show for a fraction of a second: its gauges are polled on their own, never behind a
    # (slower) exporter scrape.
    with (
        watching(engine_gauges(sglang_server.url), every=0.02) as engine_watch,
        watching(read_exporter) as exporter_watch,
    ):
        usages = burst(sglang_server.url, prompts, max_tokens=96)
        time.sleep(1.0)
    assert [u["completion_tokens"] for u in usages] == [96] * 12
    assert [u["prompt_tokens"] for u in usages] == [len(p) for p in prompts]
    peaks = engine_watch.peaks | exporter_watch.peaks
    assert peaks["sglang:num_running_reqs"] == SGLANG_SERVER.max_running_requests, peaks
    assert 1 <= peaks["sglang:num_queue_reqs"] <= 12 - SGLANG_SERVER.max_running_requests
    # The exporter saw the same (it scrapes at its own moments: at most what SGLang showed).
    assert 1 <= peaks["llmb_engine_requests_running"] <= SGLANG_SERVER.max_running_requests
    after = parse_samples(scrape(sglang_server.url))

    def grew(name: str) -> float:
        return sum(pick(after, name)) - sum(pick(before, name))

    assert grew("sglang:num_requests_total") == 12
    assert grew("sglang:generation_tokens_total") == 12 * 96
    assert grew("sglang:prompt_tokens_total") == sum(len(p) for p in prompts)
    samples = exporter.scrape()
    assert pick(samples, "llmb_engine_up", engine="sgl") == [1.0]
    assert pick(samples, "llmb_engine_kv_cache_capacity_tokens", engine="sgl") == [16384.0]
    assert pick(samples, "llmb_engine_slots", engine="sgl") == [8.0]
    assert pick(samples, "llmb_model_layers", engine="sgl") == [4.0]
    kv_per_token = pick(samples, "llmb_model_kv_bytes_per_token_estimated", engine="sgl")
    assert kv_per_token == [float(KV_BYTES_PER_TOKEN)]
    assert pick(samples, "llmb_engine_requests_finished_total", engine="sgl") == [
        sum(pick(after, "sglang:num_requests_total"))
    ]


# -- families -------------------------------------------------------------------------------------
def test_families_and_labels_are_those_of_the_h200_run(sglang_server: SglangServer) -> None:
    """The CPU server writes the families, types, label names and buckets the same release
    wrote on the H200, once a streamed and a plain request have run and the radix cache has
    been hit (the lazy families)."""
    complete(sglang_server.url, prompt_ids(16, seed=1), 8, stream=True)
    complete(sglang_server.url, prompt_ids(16, seed=1), 8)  # the same prompt: a cache hit
    real = shapes(scrape(sglang_server.url))
    h200 = shapes((H200 / "metrics-busy-c64.txt").read_text())
    assert shape_differences(real, h200) == [], "CPU and H200 runs of 0.5.11 differ"


def test_the_simulator_as_0_5_11_writes_what_the_real_server_writes(
    sglang_server: SglangServer, tmp_path: Path
) -> None:
    """`llmb-sim --sglang-version 0.5.11` against the live real server: same families, types,
    label names and buckets, except the differences listed with their reasons."""
    for stream in (True, False):
        complete(sglang_server.url, prompt_ids(16, seed=3), 8, stream=stream)
    real = shapes(scrape(sglang_server.url))
    sim = asyncio.run(simulated_shapes("0.5.11"))
    assert shape_differences(sim, real) == sorted(KNOWN_SIM_DIFFERENCES["0.5.11"])


# -- the KV pool ----------------------------------------------------------------------------------
def test_small_pool_makes_requests_wait_far_below_the_running_cap(
    sglang_pool_server: SglangServer, tmp_path: Path
) -> None:
    """350-token prompts in a 512-token pool: one runs, the others wait, the running cap (16) is
    never near, and `token_usage` stays below 0.9; diagnose (4 at a time, 8 requests of 64 tokens:
    several seconds of waiting) says the pool binds and names the pool's flags, not
    `--max-running-requests`."""
    url = sglang_pool_server.url
    # 64 tokens: SGLang sets its gauges when it logs a prefill or every 40 decode steps, and a
    # decode log while the others wait shows them waiting.
    with watching(engine_gauges(url)) as watch:
        usages = burst(url, [prompt_ids(350, seed=200 + i) for i in range(4)], 64)
    assert [(u["prompt_tokens"], u["completion_tokens"]) for u in usages] == [(350, 64)] * 4
    assert watch.peaks["sglang:num_running_reqs"] == 1, watch.peaks
    assert watch.peaks["sglang:num_queue_reqs"] >= 1, watch.peaks
    assert 0.6 < watch.peaks["sglang:token_usage"] < 0.9, watch.peaks
    out = tmp_path / "out"
    code = loadgen_main(
        ["diagnose", "--url", url, "--kind", "sglang", "--out", str(out), "--concurrency", "1,4",
         "--prompt-tokens", "350", "--max-tokens", "64", "--kv-prompt-tokens", "0",
         "--requests-per-slot", "2", "--settle", "0"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    engine = doc["engines"][0]
    verdict = evaluate(Signals(**engine["signals"]))
    assert doc["verdict"] == {engine["name"]: "kv_saturated"}, doc["decision"]["steps"]
    assert {"pool_held", "pool_reserved"} & set(verdict.evidence), verdict.evidence
    assert doc["action"] == POOL_ACTION
    assert "--max-total-tokens" in doc["action"]
    assert "--max-running-requests" not in doc["action"]


def test_retraction_when_decoding_outgrows_the_pool(
    sglang_launcher: Callable[..., SglangServer],
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
) -> None:
    """10 short prompts asking 96 tokens each need 1120 tokens of a 512-token pool: SGLang admits
    them all (conservativeness 0.05) and retracts as decoding outgrows the pool. 0.5.11 counts it
    in `num_retracted_requests_total` (declared lazily: absent until the first retraction) besides
    its gauge; the exporter reports the event; every request still gets its 96 tokens.
    A server of its own: after a retraction SGLang raises its new-token ratio and lowers it
    again only over hundreds of decode steps, so a shared server that retracted in an earlier
    test admits this burst cautiously and may never need to retract."""
    sglang_pool_server = sglang_launcher(POOL_SERVER)
    exporter = exporter_process(exporter_config(sglang_pool_server))
    url = sglang_pool_server.url
    usages = burst(url, [prompt_ids(16, seed=300 + i) for i in range(10)], 96)
    assert [u["completion_tokens"] for u in usages] == [96] * 10
    samples = parse_samples(scrape(url))
    retracted = pick(samples, "sglang:num_retracted_requests_total")
    assert len(retracted) == 1 and retracted[0] >= 1
    assert pick(samples, "sglang:num_retracted_input_tokens_total")[0] >= 16
    assert "KV cache pool is full. Retract requests." in sglang_pool_server.log_text()
    events = pick(exporter.scrape(), "llmb_engine_kv_pressure_events_total", event="retracted")
    assert events == [retracted[0]]


# -- diagnose --url -------------------------------------------------------------------------------
def gpu_file(path: Path, pid: int, process_bytes: float) -> Path:
    """One H200 in NVML's shape whose only process is the server's scheduler."""
    total = 150754820096
    used = int(process_bytes) + 600 * (1 << 20)
    device = {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-00000000-0000-4000-8000-000000000200",
        "mem": {"total": total, "used": used, "free": total - used},
        "mem_v2": {"total": total, "used": used, "free": total - used, "reserved": 0},
        "util": {"gpu": 10, "memory": 5},
        "bus_width": 6016,
        "power_mw": 150000,
        "temp": 40,
        "max_mem_clock_mhz": 3201,
        "mem_clock_mhz": 3201,
        "sm_clock_mhz": 1980,
        "procs": [{"pid": pid, "used": int(process_bytes), "cmdline": "sglang::scheduler"}],
    }
    path.write_text(json.dumps({"driver": "580.159.04", "nvml": "13.580.159.04",
                                "devices": [device]}))  # fmt: skip
    return path


def scheduler_pid(url: str) -> int:
    """The scheduler's pid, from the `pid` label SGLang puts on its retraction gauge."""
    for fam in text_string_to_metric_families(scrape(url)):
        for s in fam.samples:
            if s.labels.get("pid", "").isdigit():
                return int(s.labels["pid"])
    raise AssertionError("no pid label in /metrics")


def test_diagnose_url_decides_residency_from_the_server_numbers(
    sglang_server: SglangServer, tmp_path: Path
) -> None:
    """`llmb-loadgen diagnose --url` on the real server, with a GPU whose scheduler process holds
    the KV pool SGLang reports, the weights and a context: residency is decided (yes), from the
    process memory beyond the pool, and every step ran on real requests."""
    info = httpx.get(sglang_server.url + "/server_info", timeout=30).json()
    memory = info["internal_states"][0]["memory_usage"]
    # On a CPU SGLang's weight figure is a host-memory delta (-0.03 to 0.03 GiB seen): <= 0 is
    # "not known" and the weights come from config.json (random weights: no safetensors).
    reported = memory["weight"] * GIB
    weights = (
        reported if reported > 0 else checkpoint_weight_bytes(geometry_from_hf_config(MODEL_DIR))
    )
    process = memory["kvcache"] * GIB + weights + 0.3 * GIB
    gpu = gpu_file(tmp_path / "gpu.json", scheduler_pid(sglang_server.url), process)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"gpu": {"fake_file": str(gpu), "sample_interval_seconds": 0.1}}))
    out = tmp_path / "out"
    code = loadgen_main(
        ["diagnose", "--url", sglang_server.url, "--kind", "sglang", "--config", str(cfg),
         "--out", str(out), "--concurrency", "1,4", "--prompt-tokens", "32",
         "--max-tokens", "32", "--kv-prompt-tokens", "0", "--settle", "0"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    steps = {s["key"]: s for s in doc["decision"]["steps"]}
    residency = steps["residency"]
    assert residency["answer"].startswith("yes, from "), residency["answer"]
    assert "minus the KV pool" in residency["answer"]
    engine = doc["engines"][0]
    assert engine["weights_bytes"] == pytest.approx(weights)
    rows = {(r["step"], r["concurrency"]): r for r in engine["rows"]}
    single = rows[("single", 1)]
    assert single["tokens_ok"] and single["completion_tokens"] == 32 * single["requests"]
    assert rows[("concurrency", 4)]["aggregate_tok_s"] > 0
    assert doc["verdict"][engine["name"]] == evaluate(Signals(**engine["signals"])).name
    assert doc["verdict"][engine["name"]] != "weights_not_resident"


# -- compare against the real llama-server --------------------------------------------------------
def test_compare_real_sglang_with_real_llama_server(
    sglang_server: SglangServer, llama_server: Callable[..., Any], tmp_path: Path
) -> None:
    """`compare` on the two real CPU servers: the same prompt text and max tokens to both,
    and every request's `usage` checked against what was asked, for both engines."""
    llama = llama_server(parallel=2)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"engines": [
        {"name": "llama", "kind": "llamacpp", "url": llama.url},
        {"name": "sgl", "kind": "sglang", "url": sglang_server.url},
    ], "gpu": {"enabled": False}}))  # fmt: skip
    out = tmp_path / "out"
    code = loadgen_main(
        ["compare", "--config", str(cfg), "--engine", "llama", "--engine", "sgl",
         "--out", str(out), "--concurrency", "1,2", "--prompt-tokens", "32",
         "--max-tokens", "16", "--rounds", "1", "--kv-prompt-tokens", "0", "--settle", "0"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    by_engine = {e["name"]: e for e in doc["engines"]}
    assert set(by_engine) == {"llama", "sgl"}
    for name, engine in by_engine.items():
        rows = [r for r in engine["rows"] if r["step"] in ("single", "concurrency")]
        assert rows and all(r["tokens_ok"] for r in rows), (name, rows)
        assert all(r["completion_tokens"] == 16 * r["requests"] for r in rows), name
        # Each request's usage was read: none failed or came back short (ignore_eos honoured).
        assert all(r["requests_failed"] == 0 and r["truncated"] == 0 for r in rows), name
        assert all(r["prompt_tokens"] and r["prompt_tokens"] > 0 for r in rows), name
    # Different models and precisions: the comparison says so rather than ranking them.
    assert doc["comparable"] is False
