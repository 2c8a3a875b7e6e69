"""What the roofline's per-scrape additions cost the llama.cpp collector (issue 17: < 0.5 ms).

In one process, alternating blocks: the collector's `collect()` on the real H200 bodies with the
Qwen3-30B-A3B Q8_0 GGUF header (`model_path`) and the real `--n-cpu-moe` log (`log_file`), once
as it is and once with the issue-17 additions switched off (`add_model_structure`,
`add_kv_cache_type`, `host_experts` and the accept-length/draft series replaced by no-ops). The
difference of the per-scrape CPU time (process time, so the machine's other load counts less)
is what the additions cost; the model structure itself is computed once per model, not here.

    .venv/bin/python bench/roofline_cost.py --scrapes 2000 --blocks 10
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

from bench.exporter_latency import FIX, llama_bodies, write_moe_header
from exporter.attribution import Attribution
from exporter.collectors import llamacpp
from exporter.config import EngineConfig

LOG = FIX / "llamacpp-cpu-qwen3moe-synth-expert-offload" / "server-ncmoe1-lv5.log"


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
        mock.patch.object(llamacpp, "add_model_structure", lambda *a, **k: None),
        mock.patch.object(llamacpp, "add_kv_cache_type", lambda *a, **k: None),
        mock.patch.object(llamacpp.LlamaCppCollector, "_emit_roofline_log", lambda *a, **k: None),
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
    args = parser.parse_args()
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
