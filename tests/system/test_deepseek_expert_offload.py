"""Issue 32: `--n-cpu-moe 8` on a DeepSeek-V2-Lite shape (layer 0 dense) is 7 layers of experts.

A real CPU llama-server on a small synthetic GGUF of that shape, read by the exporter's own
llama.cpp collector: the layers counted are those that hold experts, not N of `--n-cpu-moe N`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from exporter.collectors.llamacpp.log import LogState
from exporter.collectors.llamacpp.memory import host_experts
from model.geometry import geometry_from_gguf
from tests.plugins.llama import start_llama_server
from tools.synth_model.gguf_file import write_model
from tools.synth_model.metadata import synthetic_tokenizer
from tools.synth_model.plan import Model, make_model
from tools.synth_model.shapes import SPECS

pytestmark = pytest.mark.llamaserver


def tiny_deepseek_v2_lite() -> Model:
    """DeepSeek-V2-Lite's structure (27 layers, layer 0 dense, 64 experts of which 6 used and 2
    shared, latent attention) at widths a CPU runs in a second (52.5 MB at Q4_0)."""
    spec = replace(
        SPECS["deepseek-v2-lite"],
        n_embd=256, n_head=4, n_head_kv=4, head_dim=48, rope_dim=16, v_head_dim=32,
        kv_lora_rank=64, n_ff=512, n_ff_exp=64, n_vocab=4096, ctx_train=4096,
        rope_scaling=None, rope_orig_ctx=0, expert_type="q4_0",
    )  # fmt: skip
    return make_model(spec, "deepseek-v2-lite", "q4_0", synthetic_tokenizer(spec.n_vocab))


@pytest.mark.timeout(180)
def test_n_cpu_moe_8_on_a_leading_dense_layer_is_7_layers(
    tmp_path: Path, llama_binary: Path
) -> None:
    path = tmp_path / "deepseek-v2-lite-tiny.gguf"
    write_model(tiny_deepseek_v2_lite(), path, seed=1)
    geom = geometry_from_gguf(path)
    assert geom.leading_dense_block_count == 1 and geom.routed_expert_bytes_by_layer[0] == 0
    server = start_llama_server(
        llama_binary, path, tmp_path, "--n-cpu-moe", "8", "-lv", "5", ctx=1024, parallel=1
    )
    try:
        body = {"prompt": "hello", "n_predict": 2, "ignore_eos": True}
        reply = httpx.post(f"{server.url}/completion", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["tokens_predicted"] == 2
    finally:
        server.stop()
    state = LogState()
    for line in server.log.read_text(encoding="utf-8", errors="replace").splitlines():
        state.feed(line)
    # llama.cpp overrides only the expert tensors of the first 8 layers, and layer 0 has none.
    assert {layer for layer, _ in state.expert_overrides.values()} == set(range(1, 8))
    by_layer = geom.routed_expert_bytes_by_layer
    assert host_experts(state, geom) == (7, float(sum(by_layer[1:8])))
