"""What the roofline's per-scrape additions cost the llama.cpp collector (issue 17: < 0.5 ms).

In one process, alternating blocks: the collector's `collect()` on the real H200 bodies with the
Qwen3-30B-A3B Q8_0 GGUF header (`model_path`) and the real `--n-cpu-moe` log (`log_file`), once
as it is and once with the issue-17 additions switched off (`add_model_structure`,
`add_kv_cache_type`, `host_experts` and the accept-length/draft series replaced by no-ops). The
difference of the per-scrape CPU time (process time, so the machine's other load counts less)
is what the additions cost; the model structure itself is computed once per model, not here.

    .venv/bin/python bench/roofline_cost.py --scrapes 2000 --blocks 10

`--write-header PATH` only writes that GGUF header (for `bench/exporter_latency.py --model-path`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import httpx

from bench.exporter_latency import FIX, llama_bodies
from config.settings import EngineConfig
from exporter.attribution import Attribution
from exporter.collectors.llamacpp import collector as llamacpp
from exporter.collectors.llamacpp import memory as llamacpp_memory

LOG = FIX / "llamacpp-cpu-qwen3moe-synth-expert-offload" / "server-ncmoe1-lv5.log"


def write_moe_header(path: Path) -> Path:
    """The GGUF header (no tensor data) of Qwen3-30B-A3B at Q8_0, as llama.cpp lays it out."""
    import gguf
    import numpy as np

    q8, f32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    n_embd, vocab, n_exp, n_ff = 2048, 151936, 128, 768
    tensors: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]] = [
        ("token_embd.weight", (vocab, n_embd), q8),
        ("output.weight", (vocab, n_embd), q8),
    ]
    for i in range(48):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", (n_embd,), f32),
            (b + "attn_q.weight", (4096, n_embd), q8),
            (b + "attn_k.weight", (512, n_embd), q8),
            (b + "attn_v.weight", (512, n_embd), q8),
            (b + "attn_output.weight", (n_embd, 4096), q8),
            (b + "ffn_gate_inp.weight", (n_exp, n_embd), f32),
            (b + "ffn_gate_exps.weight", (n_exp, n_ff, n_embd), q8),
            (b + "ffn_up_exps.weight", (n_exp, n_ff, n_embd), q8),
            (b + "ffn_down_exps.weight", (n_exp, n_embd, n_ff), q8),
        ]
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    for key, value in {
        "block_count": 48,
        "embedding_length": n_embd,
        "attention.head_count": 32,
        "attention.head_count_kv": 4,
        "attention.key_length": 128,
        "attention.value_length": 128,
        "expert_count": n_exp,
        "expert_used_count": 8,
        "context_length": 40960,
    }.items():
        writer.add_uint32(f"qwen3moe.{key}", value)
    for name, shape, qtype in tensors:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(shape)) // block * size
        writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


def make_collector(header: Path) -> llamacpp.LlamaCppCollector:
    bodies = llama_bodies()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=bodies.get(request.url.path, ""))

    engine = EngineConfig.model_validate(
        {
            "name": "llama",
            "kind": "llamacpp",
            "url": "http://127.0.0.1:1",
            "model_path": str(header),
            "log_file": str(LOG),
        }
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return llamacpp.LlamaCppCollector(engine, client, 2.0, Attribution([engine]))


@contextmanager
def additions_off() -> Iterator[None]:
    """The collector as it would be without the issue-17 per-scrape work."""
    with (
        mock.patch.object(llamacpp_memory, "add_model_structure", lambda *a, **k: None),
        mock.patch.object(llamacpp_memory, "add_kv_cache_type", lambda *a, **k: None),
        mock.patch.object(llamacpp_memory, "map_roofline_log", lambda *a, **k: None),
    ):
        yield


async def per_scrape_ms(c: llamacpp.LlamaCppCollector, scrapes: int) -> float:
    start = time.process_time()
    for _ in range(scrapes):
        scrape = await c.collect()
        assert scrape.up, scrape.errors
    return (time.process_time() - start) / scrapes * 1e3


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=2000, help="scrapes per block")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per variant")
    parser.add_argument("--write-header", type=Path, help="write the MoE GGUF header here, exit")
    args = parser.parse_args()
    if args.write_header:
        write_moe_header(args.write_header)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        c = make_collector(write_moe_header(Path(tmp) / "qwen3-30b-a3b-q8_0-header.gguf"))
        await per_scrape_ms(c, 50)  # warm up: the GGUF header is read here, once
        with_ms, without_ms = [], []
        for _ in range(args.blocks):
            with_ms.append(await per_scrape_ms(c, args.scrapes))
            with additions_off():
                without_ms.append(await per_scrape_ms(c, args.scrapes))
    diffs = [a - b for a, b in zip(with_ms, without_ms, strict=True)]
    print(
        f"collect() CPU per scrape: with {statistics.median(with_ms):.3f} ms, "
        f"without {statistics.median(without_ms):.3f} ms; added: median "
        f"{statistics.median(diffs) * 1e3:.1f} us, max {max(diffs) * 1e3:.1f} us "
        f"({args.blocks} blocks x {args.scrapes} scrapes)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
