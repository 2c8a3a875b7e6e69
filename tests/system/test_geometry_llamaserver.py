"""The llama.cpp KV estimate against a real llama-server (CPU, Gemma 3 270M, `-lv 4`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from model.geometry import geometry_from_gguf
from model.kv_cache import estimate_llamacpp_kv
from tests.unit.test_geometry import parse_log

pytestmark = pytest.mark.llamaserver

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("extra", "ctx", "parallel"),
    [((), 4096, 2), (("--kv-unified",), 3000, 3)],
    ids=["separate-slots", "unified"],
)
def test_estimate_matches_real_server(
    llama_server: Callable[..., object],
    gemma_model: Path,
    extra: tuple[str, ...],
    ctx: int,
    parallel: int,
) -> None:
    server = llama_server(*extra, ctx=ctx, parallel=parallel)
    log: Path = server.log  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while "SWA KV cache" not in log.read_text(errors="replace") or len(parse_log(log).caches) < 2:
        assert time.monotonic() < deadline, "no KV cache lines in the -lv 4 log"
        time.sleep(0.2)
    run = parse_log(log)
    assert (run.n_seq, run.unified) == (parallel, bool(extra))
    geom = geometry_from_gguf(gemma_model)
    est = estimate_llamacpp_kv(
        geom, n_ctx=ctx, n_seq=parallel, kv_unified=run.unified, n_ubatch=run.n_ubatch
    )
    (full_mib, full_cells, full_layers), (swa_mib, swa_cells, swa_layers) = run.caches
    assert (est.cells_full, est.cells_swa) == (full_cells, swa_cells)
    assert (geom.full_layers, geom.swa_layers) == (full_layers, swa_layers)
    assert est.full_bytes / MIB == pytest.approx(full_mib, rel=0.01)
    assert est.swa_bytes / MIB == pytest.approx(swa_mib, rel=0.01)
