"""Per-sequence decode and TTFT from the engine's own figures when the streamed text is empty
(diagnose/decision/sources.py, diagnose/load.py `engine_timing`, every surface that says it)."""

from __future__ import annotations

import pytest

from diagnose.decision.calls import measured_call, ttft_stat
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.requests import decode_rate
from diagnose.decision.sources import (
    CLIENT,
    ENGINE,
    ENGINE_NOTE,
    Figure,
    decode_text,
    figure,
    ttft_text,
)
from diagnose.decision.two_engines import decide_compare
from diagnose.load import EngineTiming, engine_timing
from diagnose.monitor import Monitor
from diagnose.options import Options
from diagnose.report.html.plots import plot_decode_per_sequence, plot_ttft
from diagnose.report.tables import ENGINE_CELLS, engine_facts, measurement_table
from loadgen.exporter_series import series_from_text
from loadgen.results import RequestRecord


def test_the_client_figure_wins_then_the_engine_then_none() -> None:
    assert figure(0.05, 0.04) == Figure(0.05, CLIENT)
    assert figure(None, 0.04) == Figure(0.04, ENGINE)
    # A 0 is no figure from either side: never a TTFT of 0.000 s.
    assert figure(0.0, 0.04) == Figure(0.04, ENGINE)
    assert figure(None, 0.0) == Figure()
    assert figure(None, None) == Figure(None, None)


def test_the_step_texts_say_the_source_and_never_print_zero() -> None:
    client = Row("e", "single", 1, ttft_s=0.0421, ttft_source=CLIENT, per_seq_tok_s=80.0,
                 per_seq_source=CLIENT)  # fmt: skip
    assert ttft_text(client) == "TTFT p50 0.042 s"
    assert decode_text(client) == "80.0 tok/s per sequence (12.5 ms/token)"
    engine = Row("e", "single", 1, ttft_s=0.0421, ttft_source=ENGINE, per_seq_tok_s=12.3,
                 per_seq_source=ENGINE)  # fmt: skip
    assert ttft_text(engine) == f"TTFT mean 0.042 s ({ENGINE_NOTE})"
    assert decode_text(engine) == f"12.3 tok/s per sequence (81.3 ms/token) ({ENGINE_NOTE})"
    for ttft in (None, 0.0):
        none = Row("e", "concurrency", 4, ttft_s=ttft)
        assert ttft_text(none) == "TTFT not measured (no streamed text)"
        assert decode_text(none) is None


def _record(**kw: object) -> RequestRecord:
    base: dict[str, object] = dict(
        engine="e", step=0, index=0, start_time=0.0, end_time=1.0, ttft_s=None, itl_mean_s=None,
        itl_p50_s=None, itl_p99_s=None, tpot_s=None, e2e_s=1.0, decode_tok_s=None,
        prompt_tokens=32, completion_tokens=16, cached_tokens=None, chunks=0,
        finish_reason="length", server_prompt_ms=None, server_predicted_ms=None,
        server_predicted_per_second=None, server_cache_n=None, server_prompt_n=None,
        server_predicted_n=None, error=None,
    )  # fmt: skip
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_a_request_s_decode_rate_is_the_clients_else_the_engines() -> None:
    assert decode_rate(_record(decode_tok_s=50.0, chunks=16)) == (50.0, CLIENT)
    # Empty text: no chunks, llama.cpp's own timing.
    assert decode_rate(_record(server_predicted_per_second=45.0)) == (45.0, ENGINE)
    # One chunk gives no client rate; neither source: none.
    assert decode_rate(_record(decode_tok_s=50.0, chunks=1)) == (None, None)
    assert decode_rate(_record(server_predicted_per_second=45.0, error="timeout")) == (None, None)


SGLANG_PAGE = """\
llmb_engine_up{{engine="sgl",host="h",kind="sglang"}} 1
llmb_engine_generation_tokens_total{{engine="sgl",host="h",kind="sglang"}} {gen}
"""
# What the exporter writes from SGLang's histograms once they exist (exporter/collectors/sglang).
SGLANG_TIMING = """\
llmb_engine_decode_tokens_total{{engine="sgl",host="h",kind="sglang"}} {tokens}
llmb_engine_decode_seconds_total{{engine="sgl",host="h",kind="sglang"}} {seconds}
llmb_engine_time_to_first_token_seconds_bucket{{engine="sgl",host="h",kind="sglang",le="+Inf"}} {n}
llmb_engine_time_to_first_token_seconds_sum{{engine="sgl",host="h",kind="sglang"}} {ttft}
llmb_engine_time_to_first_token_seconds_count{{engine="sgl",host="h",kind="sglang"}} {n}
"""


def _monitor(*pages: tuple[float, str]) -> Monitor:
    mon = Monitor("sgl", Options(concurrency=[1]))
    mon.scrapes = [(t, series_from_text(text)) for t, text in pages]
    return mon


def test_sglang_figures_are_the_histograms_increase_over_the_step() -> None:
    """Decode = Δ inter-token count / Δ sum, TTFT = Δ TTFT sum / Δ count, over the window."""
    before = SGLANG_PAGE.format(gen=40) + SGLANG_TIMING.format(
        tokens=30, seconds=1.0, ttft=0.5, n=2
    )
    after = SGLANG_PAGE.format(gen=104) + SGLANG_TIMING.format(
        tokens=90, seconds=1.6, ttft=0.9, n=6
    )
    mon = _monitor((5.0, after), (10.0, before), (11.0, before), (14.0, after), (20.0, after))
    timing = engine_timing(mon, [], 9.5, 14.5)
    assert timing.decode_tok_s == pytest.approx(60 / 0.6)
    assert timing.ttft_s == pytest.approx(0.4 / 4)
    # llama.cpp's per-request timings come first for decode (its prompt_ms is no TTFT).
    assert engine_timing(mon, [42.0, 44.0], 9.5, 14.5).decode_tok_s == 43.0


def test_histograms_born_during_the_step_count_from_zero() -> None:
    """SGLang creates its histograms at the first observation: the step's opening scrape
    lacks them while the engine was up, so they stood at 0."""
    after = SGLANG_PAGE.format(gen=16) + SGLANG_TIMING.format(
        tokens=15, seconds=0.3, ttft=0.12, n=1
    )
    mon = _monitor((10.0, SGLANG_PAGE.format(gen=0)), (12.0, after))
    timing = engine_timing(mon, [], 10.0, 12.0)
    assert timing.decode_tok_s == pytest.approx(50.0)
    assert timing.ttft_s == pytest.approx(0.12)
    # An engine that was not up at the start says nothing; one sample, a reset: no figure.
    down = SGLANG_PAGE.format(gen=0).replace("} 1\n", "} 0\n", 1)
    assert engine_timing(_monitor((10.0, down), (12.0, after)), [], 10, 12).ttft_s is None
    assert engine_timing(_monitor((12.0, after)), [], 10, 12) == EngineTiming()
    reset = SGLANG_PAGE.format(gen=0) + SGLANG_TIMING.format(tokens=1, seconds=0.1, ttft=0.1, n=1)
    assert engine_timing(_monitor((10.0, after), (12.0, reset)), [], 10, 12).ttft_s is None


def _sglang_rows() -> list[Row]:
    return [
        Row("sgl", "single", 1, ttft_s=0.1, ttft_source=ENGINE, per_seq_tok_s=100.0,
            per_token_ms=10.0, per_seq_source=ENGINE, aggregate_tok_s=95.0),
        Row("sgl", "concurrency", 4, ttft_s=0.0, per_seq_tok_s=None, aggregate_tok_s=300.0),
    ]  # fmt: skip


def test_the_measurement_table_marks_engine_figures_and_never_shows_a_zero_ttft() -> None:
    e = EngineResult("sgl", "sglang", rows=_sglang_rows())
    head, rows, notes = measurement_table([e])
    cells = [dict(zip(head, r, strict=True)) for r in rows]
    assert cells[0]["TTFT ms"] == "100.0 (engine)"
    assert cells[0]["per-seq tok/s"] == "100.0 (engine)"
    assert cells[0]["ms/token"] == "10.00 (engine)"
    assert cells[1]["TTFT ms"] == "—"  # not "0.0"
    assert ENGINE_CELLS in notes
    client = Row("l", "single", 1, ttft_s=0.1, ttft_source=CLIENT, per_seq_tok_s=50.0)
    _, _, plain = measurement_table([EngineResult("l", "llamacpp", rows=[client])])
    assert ENGINE_CELLS not in plain


def test_compare_shows_an_engine_figure_beside_the_other_and_calls_nothing_on_it() -> None:
    """llama.cpp measured by its client (16 requests), SGLang only by its histograms over the
    step (its requests streamed empty text): shown with its source, no winner."""
    llama = EngineResult("llama", "llamacpp", weights_bytes=1e9, parameters=5e8)
    llama.rows.append(Row("llama", "single", 1, per_seq_tok_s=50.0, per_seq_source=CLIENT,
                          per_seq_rounds=[50.0], ttft_s=0.05, ttft_source=CLIENT,
                          ttft_rounds=[0.05], aggregate_tok_s=49.0, aggregate_rounds=[49.0],
                          tokens_ok=True, requests=16))  # fmt: skip
    sgl = EngineResult("sgl", "sglang", weights_bytes=1e9, parameters=5e8)
    sgl.rows.append(Row("sgl", "single", 1, per_seq_tok_s=200.0, per_seq_source=ENGINE,
                        ttft_s=0.02, ttft_source=ENGINE, aggregate_tok_s=190.0,
                        aggregate_rounds=[190.0], tokens_ok=True, requests=16))  # fmt: skip
    d = decide_compare(llama, sgl)
    decode = next(s for s in d.steps if s.key == "decode")
    assert "sgl: the engine's own figure over the step" in decode.answer
    assert f"sgl: {ENGINE_NOTE}" in decode.answer
    assert not decode.decisive
    # The same through the requests: SGLang's have no per-request figure, llama's do.
    llama_reqs = [[_record(engine="llama", decode_tok_s=50.0 + i, chunks=16, ttft_s=0.05)
                   for i in range(16)]]  # fmt: skip
    sgl_reqs = [[_record(engine="sgl") for _ in range(16)]]
    call = measured_call("TTFT s", 1, llama, sgl, (0.05, 0.02), ([0.05], []),
                         (llama_reqs, sgl_reqs), ttft_stat, higher_is_better=False,
                         sources=(CLIENT, ENGINE))  # fmt: skip
    assert call is not None and call.winner is None and call.b_source == ENGINE
    assert "no per-request samples: nothing called" in call.basis


def test_the_plots_say_which_points_are_the_engine_s_and_draw_no_zero_ttft() -> None:
    e = EngineResult("sgl", "sglang", rows=_sglang_rows())
    ttft = plot_ttft([e])
    assert ttft.svg is not None
    assert ttft.notes == [f"sgl's points: {ENGINE_NOTE}, the mean of each step."]
    decode = plot_decode_per_sequence([e])
    assert f"sgl's points: {ENGINE_NOTE}." in decode.notes
    # Only the 0.0 s row: no TTFT point at all (never a 0 drawn as a measurement).
    zero = EngineResult("sgl", "sglang", rows=_sglang_rows()[1:])
    assert plot_ttft([zero]).svg is None


def test_layers_unknown_after_the_log_was_read_does_not_ask_for_the_log() -> None:
    """A CPU build's log has weight buffers but no `offloaded N/M layers` line: the Engines
    table said `the llama.cpp log was not read: pass --log-file` though it had been."""

    def layers(**kw: object) -> str:
        e = EngineResult(name="e", kind="llamacpp", layers_total=19.0, **kw)  # type: ignore[arg-type]
        return dict(engine_facts(e))["layers on the GPU"]

    read = (
        "--log-file x.log: no `offloaded N/M layers` line (a build without a GPU backend has none)"
    )
    assert layers(evidence={"log": read}) == f"unknown of 19: not in the llama.cpp log ({read})"
    unseen = layers(evidence={"log": "not seen: no --log-file (...)"})
    assert unseen.startswith("unknown of 19: the llama.cpp log was not read: pass --log-file")
    assert layers().startswith("unknown of 19: the llama.cpp log was not read")
    assert layers(layers_offloaded=19.0) == "19 of 19"
