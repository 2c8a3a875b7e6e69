"""The real CPU llama-server loads synthetic models, generates, and uses the memory we predict."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.paths import ROOT
from tests.plugins.cli import run_module
from tests.plugins.llama import LlamaServer, start_llama_server
from tools.synth_model.gguf_file import file_bytes
from tools.synth_model.metadata import read_tokenizer
from tools.synth_model.plan import build_model
from tools.synth_model.shapes import SPECS, ArchSpec

pytestmark = pytest.mark.llamaserver

REPO = ROOT
MIB = 1 << 20
N_CTX = 1024
N_PREDICT = 16


def synth(out: Path, *args: str) -> str:
    """Run llmb-synth-model as a user would; returns its stdout."""
    proc = run_module("tools.synth_model", *args, "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@contextmanager
def serve(binary: Path, model: Path, workdir: Path) -> Iterator[LlamaServer]:
    """llama-server on the synthetic model: one slot, N_CTX cells, 2 threads, `-lv 4` log."""
    server = start_llama_server(binary, model, workdir, ctx=N_CTX, parallel=1, metrics=False)
    try:
        yield server
    finally:
        server.stop()


def rss_bytes(server: LlamaServer) -> int:
    """Resident memory of the server process (mapped weights count once touched)."""
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match, status
    return int(match.group(1)) * 1024


def generate(server: LlamaServer, n_predict: int = N_PREDICT) -> dict[str, object]:
    """One completion of exactly `n_predict` tokens, whatever the random model samples."""
    body = {
        "prompt": "The quick brown fox jumps over the lazy dog. " * 4,
        "n_predict": n_predict,
        "ignore_eos": True,
        "temperature": 0,
        "cache_prompt": False,
    }
    reply = httpx.post(f"{server.url}/completion", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    result: dict[str, object] = reply.json()
    return result


def log_mib(log: str, what: str, required: bool = True) -> float:
    """Sum of the `<what> buffer size = N MiB` lines llama.cpp prints at load."""
    values = re.findall(rf"{what} buffer size = +([\d.]+) MiB", log)
    assert values or not required, f"no '{what} buffer size' line in the log"
    return sum(float(v) for v in values)


def kv_bytes(spec: ArchSpec, n_ctx: int, n_ubatch: int = 512) -> int:
    """KV cache size predicted from the shape alone (f16 K and V, as llama.cpp allocates them)."""
    per_token_layer = 2 * spec.n_head_kv * spec.head_dim * 2
    total = 0
    for layer in range(spec.n_layer):
        # Gemma 3: five sliding-window layers, then one global layer. A sliding layer keeps the
        # window plus one micro-batch of cells (rounded up to 256), never more than the context.
        sliding = spec.sliding_window and (layer + 1) % 6 != 0
        cells = min(n_ctx, -(-(spec.sliding_window + n_ubatch) // 256) * 256) if sliding else n_ctx
        total += cells * per_token_layer
    return total


@pytest.mark.timeout(180)
def test_gemma3_shape_with_real_tokenizer_loads_generates_and_fits_the_estimate(
    tmp_path: Path, llama_binary: Path, gemma_model: Path
) -> None:
    # The path a machine without internet takes: carry the tokenizer alone, build from it.
    tok_path = tmp_path / "gemma3-tokenizer.gguf"
    synth(tok_path, "--save-tokenizer", "--tokenizer-from", str(gemma_model))
    assert tok_path.stat().st_size < 10 * MIB < gemma_model.stat().st_size
    model_path = tmp_path / "gemma3-270m-synthetic-q4_0.gguf"
    synth(model_path, "--like", "gemma3-270m", "--type", "q4_0", "--tokenizer-from", str(tok_path))
    real_tokenizer = read_tokenizer(gemma_model)
    assert read_tokenizer(model_path) == real_tokenizer
    model = build_model("gemma3-270m", "q4_0", real_tokenizer)
    assert model_path.stat().st_size == file_bytes(model)

    with serve(llama_binary, model_path, tmp_path) as server:
        meta = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["meta"]
        # llama-server counts the same parameters and bytes the tool planned.
        assert meta["n_params"] == model.n_params
        assert meta["size"] == model.data_bytes
        assert meta["n_vocab"] == model.spec.n_vocab
        assert meta["n_embd"] == model.spec.n_embd

        result = generate(server)
        assert result["tokens_predicted"] == N_PREDICT
        timings = result["timings"]
        assert isinstance(timings, dict)
        assert timings["predicted_n"] == N_PREDICT
        assert timings["predicted_per_second"] > 0
        assert isinstance(result["content"], str)

        log = server.log.read_text(errors="replace")
        # The weights llama.cpp mapped are the bytes we wrote (the log rounds to 0.01 MiB).
        assert abs(log_mib(log, "CPU_Mapped model") * MIB - model.data_bytes) < 0.01 * MIB
        # The KV cache it allocated is the one the shape predicts.
        assert abs(log_mib(log, "KV") * MIB - kv_bytes(model.spec, N_CTX)) < 0.01 * MIB
        # Resident memory: weights (every page touched by decoding; a second copy if the CPU
        # backend repacks them, which the log reports as another model buffer) + KV + compute
        # buffers, plus the binary and its threads.
        weights = model.data_bytes + log_mib(log, "CPU_REPACK model", required=False) * MIB
        estimate = weights + kv_bytes(model.spec, N_CTX) + log_mib(log, "compute") * MIB
        rss = rss_bytes(server)
        assert 0.9 * estimate < rss < estimate + 100 * MIB, (rss, estimate)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("like", "wtype", "layers"),
    [
        # The 27B's own layer geometry (5376 wide, 32/16 heads of 128, FFN 21504), one block deep.
        ("gemma3-27b", "q4_0", "1"),
        # Llama and Qwen layouts (untied output, Q/K/V biases, Q/K norms) with the synthetic
        # tokenizer.
        ("llama3-8b", "q4_0", "1"),
        ("qwen2.5-7b", "q4_0", "1"),
        ("qwen3-8b", "q4_0", "1"),
        # Q8_0 and F16 blocks, on the small shape to keep the files small.
        ("gemma3-270m", "q8_0", "2"),
        ("gemma3-270m", "f16", "2"),
    ],
)
def test_other_shapes_and_types_load_and_generate(
    tmp_path: Path, llama_binary: Path, like: str, wtype: str, layers: str
) -> None:
    model_path = tmp_path / f"{like}-{wtype}.gguf"
    synth(model_path, "--like", like, "--type", wtype, "--layers", layers)
    spec = replace(SPECS[like], n_layer=int(layers))
    model = build_model(like, wtype, None, layers=int(layers))
    with serve(llama_binary, model_path, tmp_path) as server:
        meta = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["meta"]
        assert (meta["n_params"], meta["size"]) == (model.n_params, model.data_bytes)
        assert meta["n_vocab"] == spec.n_vocab
        # A few tokens: a 262k-row output matrix costs ~0.2 s a token on 2 cores.
        result = generate(server, n_predict=4)
        assert result["tokens_predicted"] == 4
        log = server.log.read_text(errors="replace")
        assert re.search(rf"n_head_kv += {spec.n_head_kv}$", log, re.MULTILINE)
        assert re.search(rf"n_embd_head_k += {spec.head_dim}$", log, re.MULTILINE)
        assert abs(log_mib(log, "KV") * MIB - kv_bytes(spec, N_CTX)) < MIB


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("like", "wtype", "layers", "file_type"),
    [
        # Qwen3-30B-A3B's own block (128 experts of 768, 8 used, F32 router), one block deep.
        ("qwen3-30b-a3b", "q4_0", 1, "Q4_0"),
        # gpt-oss-20b: MXFP4 experts with biases, attention sinks, one SWA and one full layer.
        ("gpt-oss-20b", "q8_0", 2, "MXFP4 MoE"),
    ],
)
def test_moe_shapes_load_generate_and_fit_the_kv_estimate(
    tmp_path: Path, llama_binary: Path, like: str, wtype: str, layers: int, file_type: str
) -> None:
    from model.geometry import geometry_from_gguf
    from model.kv_cache import estimate_llamacpp_kv

    model_path = tmp_path / f"{like}-{wtype}.gguf"
    synth(model_path, "--like", like, "--type", wtype, "--layers", str(layers))
    model = build_model(like, wtype, None, layers=layers)
    spec = model.spec
    with serve(llama_binary, model_path, tmp_path) as server:
        meta = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["meta"]
        assert (meta["n_params"], meta["size"]) == (model.n_params, model.data_bytes)
        result = generate(server, n_predict=4)
        assert result["tokens_predicted"] == 4
        log = server.log.read_text(errors="replace")
    assert re.search(rf"print_info: n_expert += {spec.n_expert}$", log, re.MULTILINE)
    assert re.search(rf"print_info: n_expert_used += {spec.n_expert_used}$", log, re.MULTILINE)
    assert re.search(rf"print_info: n_ff_exp += {spec.n_ff_exp}$", log, re.MULTILINE)
    assert re.search(rf"print_info: file type += {file_type}$", log, re.MULTILINE)
    assert abs(log_mib(log, "CPU_Mapped model") * MIB - model.data_bytes) < 0.01 * MIB
    # The exporter's KV estimate (SWA layers included) is what llama.cpp allocated.
    estimate = estimate_llamacpp_kv(geometry_from_gguf(model_path), N_CTX)
    assert abs(log_mib(log, "KV") * MIB - estimate.total) < 0.01 * MIB
    if spec.sliding_window:
        assert estimate.swa_bytes > 0
        assert f"creating     SWA KV cache, size = {estimate.cells_swa} cells" in log


@pytest.mark.timeout(240)
def test_a_synthetic_draft_model_speculates_for_a_synthetic_target(
    tmp_path: Path, llama_binary: Path
) -> None:
    """Qwen 3 shapes share the synthetic 151,936-token vocabulary, so llama-server accepts the
    small one as the MoE's draft (`-md`); with random weights the draft guesses wrong."""
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    synth(target, "--like", "qwen3-30b-a3b", "--layers", "1")
    synth(draft, "--like", "qwen3-0.6b", "--layers", "2")
    server = start_llama_server(
        llama_binary, target, tmp_path, "-md", str(draft), "--spec-type", "draft-simple",
        ctx=N_CTX, parallel=1,
    )  # fmt: skip
    try:
        result = generate(server, n_predict=8)
        slots = httpx.get(f"{server.url}/slots", timeout=10).json()
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    assert result["tokens_predicted"] == 8
    timings = result["timings"]
    assert isinstance(timings, dict) and timings["draft_n"] > 0
    assert slots[0]["speculative"] is True
    drafts = re.search(r"^llamacpp:spec_decode_num_drafts_total (\S+)$", metrics, re.MULTILINE)
    assert drafts and float(drafts.group(1)) > 0
    log = server.log.read_text(errors="replace")
    assert f"loading draft model '{draft}'" in log
